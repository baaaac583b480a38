"""A backend that kills its process fails the tests it crashed, serial and under ``-n``; the run goes on.

Each run here is a real pytest in a subprocess with a backend that dies (a signal, abort) in one step of one
scenario: the crashed tests fail naming the signal and the step, the tests that never reach that step pass,
and every report (terminal, results.json, summary.md) shows the failures.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from pytest_ptn import expectations
from pytest_ptn.instruments.process_end import ProcessEnd
from pytest_ptn.scheduling import crashes

CRASHING_BACKENDS = """
import os
import signal

from pytest_ptn.backends.reference import ReferenceBackend


class SegfaultOnLoad(ReferenceBackend):
    name = "segfault-on-load"

    def load(self, lowered):
        os.kill(os.getpid(), signal.SIGSEGV)


class AbortOnRun(ReferenceBackend):
    name = "abort-on-run"

    def load(self, lowered):
        loaded = super().load(lowered)
        run = loaded.run

        def dying_run(method, inputs):
            if method == "decode":
                os.abort()
            return run(method, inputs)

        loaded.run = dying_run
        return loaded
"""

LOADING_TESTS = {"test_each_method_matches_eager", "test_valid_program_lowers_and_loads"}
"""Tests of the scenario selected below that load the program (E1, E2; S2/S4/S5 also load)."""


COLLIDING_LITERALS = "colliding_literals and not in_bf16 and not in_fp16"
"""The float32 scenario alone (not its bf16 and fp16 variants)."""


@pytest.fixture
def crashing(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:randomly")  # the default: isolation on
    pytester.makepyfile(crashing_backends=CRASHING_BACKENDS)
    pytester.makeini(f"[pytest]\npythonpath = {pytester.path}\n")
    return pytester


def run(
    pytester: pytest.Pytester, backend: str, *args: str, select: str = COLLIDING_LITERALS
) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        f"--ptn-backend=crashing_backends:{backend}",
        "-k",
        select,
        "-p",
        "no:cacheprovider",
        "--ptn-report",
        "report",
        "-rf",
        *args,
    )


def failures(pytester: pytest.Pytester) -> list[dict]:
    results = json.loads((pytester.path / "report" / "results.json").read_text())["results"]
    return [r for r in results if r["outcome"] != "pass"]


def test_segfault_fails_the_tests_that_load_and_the_run_goes_on(crashing: pytest.Pytester) -> None:
    """Loaded with ``-p pytest_ptn.plugin`` (the nightly job's source checkout), which registers the plugin
    before xdist: the one-worker default must not depend on that order (the listed-crash test below loads
    it by its entry point)."""
    dash_p = ("-p", "no:ptn", "-p", "pytest_ptn.plugin")
    result = run(crashing, "SegfaultOnLoad", *dash_p, select=f"({COLLIDING_LITERALS}) or generated")
    outcomes = result.parseoutcomes()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*crash isolation on*", "created: 1/1 worker*"])
    assert outcomes.get("passed", 0) >= 6, outcomes  # P1-P5, P9 only lower
    assert outcomes["failed"] == 7, (
        outcomes
    )  # E1 (both schedules), E2, S2, S4, S5 load; so does the fuzz test; A1 (a SHOULD, xfailed) does too
    result.stdout.fnmatch_lines(
        ["*killed by SIGSEGV*while loading spec*", "the program, as a test:", "*def test_*"]
    )
    result.stdout.fnmatch_lines(
        ["*crash isolation on*", "*killed by SIGSEGV*while loading colliding_literals*"]
    )
    failed = failures(crashing)
    assert {r["rule"] for r in failed} == {"E1", "E2", "S2", "S4", "S5", "A1"}
    assert all("SIGSEGV" in r["reason"] for r in failed), failed
    summary = (crashing.path / "report" / "summary.md").read_text()
    assert "MUST: all pass" not in summary and "SIGSEGV" in summary


def test_abort_under_xdist_fails_the_running_tests_and_the_run_goes_on(crashing: pytest.Pytester) -> None:
    result = run(crashing, "AbortOnRun", "-n", "2")
    outcomes = result.parseoutcomes()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert outcomes["failed"] >= 1 and outcomes.get("passed", 0) >= 6, outcomes
    result.stdout.fnmatch_lines(["*killed by SIGABRT*while running decode() colliding_literals*"])
    failed = failures(crashing)
    assert failed and all("SIGABRT" in r["reason"] for r in failed), failed
    assert "MUST: all pass" not in (crashing.path / "report" / "summary.md").read_text()


def test_in_process_run_says_a_crash_ends_it(pytester: pytest.Pytester) -> None:
    """And that a hang is not isolated there either: the time limit needs a worker to end."""
    result = pytester.runpytest_inprocess("--ptn-backend=reference", "--co", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*crash isolation off*crashes ends the run*hangs is not isolated either*"])


@pytest.mark.parametrize(
    ("returncode", "fault", "said"),
    [
        (-signal.SIGSEGV, "", "killed by SIGSEGV"),
        (None, "Fatal Python error: Bus error\n", "killed by SIGBUS"),
        (7, "", "exited with status 7"),
        (None, "", "without an exit status or a fatal-error report"),
    ],
)
def test_how_a_worker_died_is_named(returncode: int | None, fault: str, said: str) -> None:
    assert said in str(ProcessEnd.of(returncode, fault))


def test_a_crashed_step_fails_later_tests_of_its_case_at_once(tmp_path: Path) -> None:
    (tmp_path / "gw0.last").write_text(
        json.dumps({"step": {"backend": "b", "scenario": "s", "step": "loading"}, "attached": "program X"})
    )
    text, mechanism = crashes.crash_report(
        tmp_path, "gw0", -signal.SIGSEGV, "t.py::test[b-s]", "pytest t.py", {"vendorlib": "2026.4.1"}
    )
    assert "while loading s on b" in text and "program X" in text and "pytest t.py -n 0" in text
    assert text.splitlines()[1] == "with vendorlib 2026.4.1"  # a crash is often one release's
    assert mechanism.key == "crash:running:SIGSEGV"  # loading a method is part of running the program
    assert mechanism.detail == "the worker was killed by SIGSEGV (Segmentation fault) while loading"
    log = crashes.WorkerLog(tmp_path, "gw1")
    with pytest.raises(
        crashes.CrashedEarlier, match=r"killed by SIGSEGV \(Segmentation fault\) in t.py::test"
    ) as earlier:
        log.enter(crashes.Activity("b", "s", "loading"))
    assert earlier.value.mechanism.key == mechanism.key
    log.enter(crashes.Activity("b", "s", "lowering"))  # another step of the case still runs


def test_a_crash_an_expectation_lists_is_that_expected_failure(crashing: pytest.Pytester) -> None:
    """The controller, not the dead worker, decides: a listed crash is an xfail naming the crash and the
    expectation (a vendor's known use-after-free), and the run is green. The controller asks the entries'
    own match, which lists E2's crash and not E1's: an unlisted crash fails as in the tests above."""
    (crashing.path / "known.toml").write_text(
        'backend = "segfault-on-load"\n'
        "[[xfail]]\n"
        'rule = "E2"\nscenario = "colliding_literals"\n'
        'reason = "its loader frees what it still reads"\nlink = ""\n'
    )
    loads = f"{COLLIDING_LITERALS} and lowers_and_loads"
    result = run(crashing, "SegfaultOnLoad", "--ptn-expectations", "known.toml", select=loads)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert result.parseoutcomes() == {"xfailed": 1}
    (row,) = failures(crashing)
    assert row["outcome"] == "xfail"
    assert "its loader frees what it still reads" in row["reason"] and "killed by SIGSEGV" in row["reason"]
    (entry,) = expectations.read(crashing.path / "known.toml").entries
    assert entry.matches("segfault-on-load", ["E2"], "colliding_literals")
    assert not entry.matches("segfault-on-load", ["E1"], "colliding_literals", "up_front")
