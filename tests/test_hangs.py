"""A backend step that never returns fails its test, never the run, serial and under ``-n``.

Each run here is a real pytest in a subprocess with a backend whose lowering never returns (it waits on a
lock nobody releases, as a deadlocked compiler does) for programs that have a method named ``decode``:
``colliding_literals`` has one, ``single_method`` has not. The run ends by itself, its results are complete,
the single_method tests pass and every failed test names the hang.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_ptn.scheduling import crashes, hangs

HANGING_BACKENDS = """
import threading

from pytest_ptn.backends.reference import ReferenceBackend


class HangsOnDecode(ReferenceBackend):
    name = "hangs-on-decode"

    def lower(self, programs, workdir):
        if "decode" in programs:
            threading.Event().wait()  # never set: a deadlock, in C, holding no progress
        return super().lower(programs, workdir)
"""

BEFORE_THE_FIRST_STEP = """
import ctypes
import os
import time

from pytest_ptn.backends.reference import ReferenceBackend


def hang(how):
    if how == "sleeping":
        while True:
            time.sleep(0.1)
    ctypes.PyDLL(None).sleep(3600)  # in C, holding the GIL


class HangsInInit(ReferenceBackend):
    name = "hangs-in-init"
    how = "sleeping"

    def __init__(self):
        hang(self.how)


class HangsInAvailability(ReferenceBackend):
    name = "hangs-in-availability"
    how = "sleeping"

    @classmethod
    def availability(cls):
        hang(cls.how)


class HangsInLoadRuntime(ReferenceBackend):
    name = "hangs-in-load-runtime"
    how = "sleeping"

    @classmethod
    def load_runtime(cls):
        hang(cls.how)


class HangsInAvailabilityInWorkers(ReferenceBackend):
    name = "hangs-in-availability-in-workers"

    @classmethod
    def availability(cls):
        if os.environ.get("PYTEST_XDIST_WORKER"):
            hang("sleeping")
        return super().availability()


class HangsInInitWithTheGil(HangsInInit):
    how = "holding the GIL"


class HangsInAvailabilityWithTheGil(HangsInAvailability):
    how = "holding the GIL"


class HangsInLoadRuntimeWithTheGil(HangsInLoadRuntime):
    how = "holding the GIL"
"""

HUNG_CHILDREN = """
import os
import subprocess
import sys
import time
from pathlib import Path

from pytest_ptn.backends.reference import ReferenceBackend
from pytest_ptn.instruments.isolation import run_isolated

PIDS = Path(os.environ["PTN_TEST_PIDS"])


def note_and_sleep():
    with PIDS.open("a") as f:
        print(os.getpid(), file=f)
    time.sleep(3600)


class HangsInItsChildren(ReferenceBackend):
    name = "hangs-in-its-children"

    def lower(self, programs, workdir):
        if "decode" in programs:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
            with PIDS.open("a") as f:
                print(child.pid, file=f)
            run_isolated(note_and_sleep)  # a fresh process that never answers
        return super().lower(programs, workdir)
"""

LIMIT = 5
"""Seconds: above any step of single_method on a loaded machine, and what each hang costs the test."""

SELECT = "(colliding_literals or single_method) and not in_bf16 and not in_fp16"
"""The float32 scenarios (not their bf16 and fp16 variants)."""


@pytest.fixture
def hanging(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:randomly")  # the default: isolation on
    pytester.makepyfile(hanging_backends=HANGING_BACKENDS)
    pytester.makeini(f"[pytest]\npythonpath = {pytester.path}\n")
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "--ptn-backend=hanging_backends:HangsOnDecode",
        "-k",
        SELECT,
        "-p",
        "no:cacheprovider",
        "--ptn-report",
        "report",
        *args,
    )


def results_of(pytester: pytest.Pytester) -> tuple[dict, list[dict]]:
    data = json.loads((pytester.path / "report" / "results.json").read_text())
    return data["run"], data["results"]


def assert_the_hang_is_contained(pytester: pytest.Pytester, result: pytest.RunResult) -> list[dict]:
    """The run ended with every selected test finished, single_method green, every failure the hang (an
    expected failure carries its expectation's reason)."""
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    run_status, rows = results_of(pytester)
    assert run_status["complete"] and run_status["finished"] == run_status["selected"] > 0, run_status
    assert {r["outcome"] for r in rows if r["scenario"] == "single_method"} == {"pass"}
    hung = [r for r in rows if r["scenario"] == "colliding_literals"]
    assert hung and all(r["outcome"] in ("fail", "xfail") for r in hung), hung
    failed = [r for r in hung if r["outcome"] == "fail"]
    assert all("hung" in r["reason"] and f"no progress for {LIMIT} s" in r["reason"] for r in failed), hung
    return hung


def test_a_hung_lowering_fails_its_tests_and_the_run_goes_on(hanging: pytest.Pytester) -> None:
    result = run(hanging, f"--ptn-timeout={LIMIT}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines([f"*crash isolation on*a step with no progress for {LIMIT} s fails as hung"])
    hung = assert_the_hang_is_contained(hanging, result)
    (first,) = [r for r in hung if r["reason"].startswith("hung:")]
    lines = first["reason"].splitlines()
    assert lines[0] == f"hung: no progress for {LIMIT} s while lowering colliding_literals on hangs-on-decode"
    assert f"--ptn-timeout={LIMIT}" in first["reason"] and "faulthandler, every thread" in first["reason"]
    assert any("hanging_backends.py" in line and "in lower" in line for line in lines), first["reason"]
    later = [r for r in hung if r is not first]
    assert later and all(
        "lowering colliding_literals on hangs-on-decode hung earlier in this run, not retried" in r["reason"]
        for r in later
    )


def test_a_hang_under_xdist_an_expectation_lists_is_that_expected_failure(hanging: pytest.Pytester) -> None:
    """Two workers, the limit from the ini file, and the first test to hang (E1, the first of its case)
    listed: the controller reports it as the xfail, and the E1 test of the other schedule, failed at once in
    a worker, is the xfail too."""
    hanging.makeini(f"[pytest]\npythonpath = {hanging.path}\nptn_timeout = {LIMIT}\n")
    (hanging.path / "known.toml").write_text(
        'backend = "hangs-on-decode"\n'
        "[[xfail]]\n"
        'rule = "E1"\nscenario = "colliding_literals"\n'
        'reason = "its compiler deadlocks on decode"\nlink = ""\n'
    )
    result = run(hanging, "-n", "2", "--ptn-expectations", "known.toml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    hung = assert_the_hang_is_contained(hanging, result)
    listed = [r for r in hung if r["rule"] == "E1"]
    assert len(listed) == 2 and all(r["outcome"] == "xfail" for r in listed), listed
    assert all("its compiler deadlocks on decode" in r["reason"] for r in listed)
    first = "the first hang, reported by the controller"
    assert any("hung: no progress" in r["reason"] for r in listed), first
    assert all(r["outcome"] == "fail" for r in hung if r["rule"] != "E1")


@pytest.mark.parametrize(
    ("backend", "call", "workers"),
    [
        ("HangsInInit", "__init__", "1"),
        ("HangsInInitWithTheGil", "__init__", "2"),
        ("HangsInLoadRuntimeWithTheGil", "load_runtime()", "1"),
        ("HangsInLoadRuntime", "load_runtime()", "2"),
        ("HangsInAvailability", "availability()", "1"),  # the controller's call
        ("HangsInAvailabilityWithTheGil", "availability()", "2"),
        ("HangsInAvailabilityInWorkers", "availability()", "2"),  # the workers' call
    ],
)
def test_a_backend_that_hangs_before_its_first_step_ends_the_run_naming_the_call(
    hanging: pytest.Pytester, backend: str, call: str, workers: str
) -> None:
    """A call into the backend before any case is a step: the run ends by itself, a usage error naming the
    backend, the call and its stack, nothing passed. The controller asks availability() first, for the
    header: a backend hanging there hangs in the controller, HangsInAvailabilityInWorkers in the workers."""
    hanging.makepyfile(before_first_step=BEFORE_THE_FIRST_STEP)
    result = hanging.runpytest_subprocess(
        f"--ptn-backend=before_first_step:{backend}", "-k", "single_method and E1 and not in_bf16",
        "-p", "no:cacheprovider", f"--ptn-timeout={LIMIT}", "-n", workers, timeout=60,
    )  # fmt: skip
    said = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, said
    assert f"calling {call}" in said or f": {call} made no progress for {LIMIT} s" in said, said
    assert f"no progress for {LIMIT} s" in said and "before_first_step.py" in said, said
    assert not re.search(r"\d+ passed", said), said


def test_a_hung_workers_children_end_with_it(
    hanging: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step hung in instruments.isolation's fresh process, with a child of the backend's beside it: the
    test fails as hung and neither child outlives the run (with ``-s`` they held its output open)."""
    pids = hanging.path / "pids.txt"
    monkeypatch.setenv("PTN_TEST_PIDS", str(pids))
    hanging.makepyfile(hung_children=HUNG_CHILDREN)
    result = hanging.runpytest_subprocess(
        "--ptn-backend=hung_children:HangsInItsChildren", "-k", "colliding_literals and E1 and not in_bf16",
        "-p", "no:cacheprovider", f"--ptn-timeout={LIMIT}", "-s", timeout=120,
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines([f"*hung: no progress for {LIMIT} s while lowering colliding_literals*"])
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) >= 2, started
    alive = []
    for pid in started:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"left alive by the run: {alive} of {started}"


@pytest.mark.parametrize(
    ("args", "ini", "said"),
    [
        (["--ptn-timeout=-1"], "", "--ptn-timeout: -1 is not a number of seconds >= 0"),
        ([], "ptn_timeout = soon", "ptn_timeout (ini): 'soon' is not a number of seconds"),
    ],
)
def test_a_limit_that_is_not_seconds_is_a_usage_error(
    pytester: pytest.Pytester, args: list[str], ini: str, said: str
) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    result = pytester.runpytest_inprocess("--ptn-backend=reference", "--co", "-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert said in result.stderr.str()


def test_the_limit_comes_from_the_option_then_the_ini_then_the_default(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nptn_timeout = 42\n")
    assert hangs.limit(pytester.parseconfig()) == 42
    assert hangs.limit(pytester.parseconfig("--ptn-timeout=0")) == 0  # no limit
    pytester.makeini("[pytest]\n")
    assert hangs.limit(pytester.parseconfig()) == hangs.DEFAULT_LIMIT


@pytest.mark.parametrize("given", ["inf", "1e10"])
def test_a_limit_beyond_the_watchdogs_clock_is_no_limit(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    """faulthandler cannot arm inf or 1e10 s (OverflowError in every test): they are no limit, and the
    worker's steps run under it."""
    assert hangs.limit(pytester.parseconfig(f"--ptn-timeout={given}")) == 0
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:randomly")  # the default: isolation on
    result = pytester.runpytest_subprocess(
        "--ptn-backend=reference", "-k", "single_method and E1 and not in_bf16 and not in_fp16",
        "-p", "no:cacheprovider", f"--ptn-timeout={given}",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["*crash isolation on*no time limit*", "*passed*"])


def test_the_watchdog_ends_a_process_that_makes_no_progress(tmp_path: Path) -> None:
    """Progress restarts the clock; while idle nothing runs it; past the limit every thread's stack goes to
    the file and the process ends."""
    fault = tmp_path / "gw0.fault"
    script = textwrap.dedent(
        f"""
        import threading, time
        from pytest_ptn.scheduling.hangs import Watchdog

        watchdog = Watchdog(0.3, open({str(fault)!r}, "w"))
        for _ in range(6):  # 0.9 s in all, never 0.3 s without progress
            watchdog.progress()
            time.sleep(0.15)
        watchdog.idle()
        time.sleep(0.6)
        print("idle is not a hang", flush=True)
        threading.Thread(target=threading.Event().wait, daemon=True, name="helper").start()
        watchdog.progress()
        threading.Event().wait()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == "idle is not a hang\n", done
    dump = fault.read_text()
    assert hangs.is_timeout_dump(dump) and dump.count("Thread 0x") == 2, dump


def test_a_hung_step_fails_later_tests_of_its_case_at_once(tmp_path: Path) -> None:
    step = {"backend": "b", "scenario": "s", "step": "loading"}
    (tmp_path / "gw0.last").write_text(json.dumps({"step": step}))
    (tmp_path / "gw0.fault").write_text(
        'Timeout (0:00:30)!\nThread 0x00007f (most recent call first):\n  File "b.py", line 3 in load\n'
    )
    text, mechanism = crashes.crash_report(tmp_path, "gw0", 1, "t.py::test[b-s]", "pytest t.py", {}, 30)
    assert text.splitlines()[0] == "hung: no progress for 30 s while loading s on b"
    assert mechanism.key == "hang:running"
    assert "pytest t.py --ptn-timeout=30" in text and 'File "b.py", line 3 in load' in text
    log = crashes.WorkerLog(tmp_path, "gw1")
    with pytest.raises(
        crashes.CrashedEarlier,
        match=r"loading s on b hung earlier in this run, not retried: no progress for 30 s in t.py::test",
    ) as earlier:
        log.enter(crashes.Activity("b", "s", "loading"))
    assert earlier.value.mechanism.key == "hang:running"


def test_each_fuzz_example_is_a_step(
    warm_torch: None, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fuzz test enters a step as each example starts, before it exports and runs the program: a hang in
    one example is that example's, not the last call of the one before."""
    from hypothesis import settings
    from pytest_ptn.conformance import test_fuzz

    from pytest_ptn.backends.reference import ReferenceBackend
    from pytest_ptn.fuzzing.run import FuzzRun, FuzzShare

    steps: list[tuple[str, str]] = []

    def enter(backend: str, scenario: str, step: str, known: bool = True, limited: bool = True) -> None:
        steps.append((step, scenario))

    monkeypatch.setattr(crashes, "enter", enter)
    examples = settings(max_examples=2, database=None, derandomize=True, deadline=None)
    request: Any = SimpleNamespace(node=SimpleNamespace(user_properties=[]))  # the tally goes there
    run = FuzzRun(examples, 0, FuzzShare(0, 1), {})
    test_fuzz.test_generated_programs_match_eager(request, ReferenceBackend(), run, tmp_path_factory)
    starts = [i for i, step in enumerate(steps) if step == ("lowering", "a generated program")]
    assert len(starts) == 2 and starts[0] == 0, steps
    assert all(steps[i + 1] == ("lowering", "spec") for i in starts), steps
