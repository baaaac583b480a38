"""Runs that stop early: verdicts streamed as tests finish, incomplete reports, real signals, shard merges.

The signal tests run a real pytest in a subprocess, through the default one-worker xdist controller (as a
conformance run does), on a small suite whose last-but-three test sleeps: once the stream holds every test
before it, that test is running, and the signal lands at a known point without any wall-clock guess.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_ptn.cli.main import main as ptn_cli
from pytest_ptn.reporting import render, results, stream
from pytest_ptn.ruleset import SPEC_VERSION

ROOT = Path(__file__).resolve().parents[1]
FAST = 5
AFTER = 3
SLOW_SUITE = f"""
import time

import pytest


@pytest.mark.E1
@pytest.mark.parametrize("n", range({FAST}))
def test_fast(n):
    pass


@pytest.mark.E1
def test_slow():
    time.sleep(60)


@pytest.mark.E1
@pytest.mark.parametrize("n", range({AFTER}))
def test_after(n):
    pass
"""
SELECTED = FAST + 1 + AFTER


def streamed_tests(outdir: Path) -> int:
    path = outdir / stream.NAME
    if not path.exists():
        return 0
    return sum(line.startswith('{"test"') for line in path.read_text().splitlines())


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@dataclass
class Run:
    """A conformance run of the slow suite in a subprocess (an xdist controller and its one worker)."""

    proc: subprocess.Popen[bytes]
    outdir: Path
    output: Path

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        """Poll until ``condition()`` holds; fail with the run's output if it ends first."""
        while not condition():
            if self.proc.poll() is not None:
                pytest.fail(f"the run ended before {what}:\n{self.output.read_text()}")
            time.sleep(0.1)

    def wait_for_fast_tests(self) -> None:
        self.wait_for(lambda: streamed_tests(self.outdir) == FAST, f"{FAST} tests finished")

    def finish(self) -> str:
        self.proc.wait(timeout=120)
        return self.output.read_text()


@pytest.fixture
def slow_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Run]]:
    """Starts the slow suite (or other arguments) as a conformance run; ends what is left of it, worker
    included, afterwards."""
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:randomly")  # the default: an xdist controller and one worker
    pytester.makepyfile(test_slow_suite=SLOW_SUITE)
    started: list[Run] = []

    def start(*args: str) -> Run:
        outdir, output = pytester.path / "out", pytester.path / "output.txt"
        cmd = [sys.executable, "-m", "pytest", *(args or ["test_slow_suite.py"]), "--ptn-backend=reference"]
        cmd += ["-p", "no:cacheprovider", "--ptn-report", str(outdir)]
        # Output to a file: a pipe nobody reads while the test polls could fill and stall the run.
        with output.open("w") as out:
            proc = pytester.popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        started.append(Run(proc, outdir, output))
        return started[-1]

    yield start
    for run in started:
        workers = children(run.proc.pid) if run.proc.poll() is None else []
        run.proc.kill()
        run.proc.wait()
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def assert_incomplete(outdir: Path, finished: int, why: str) -> dict[str, object]:
    """Every report marked incomplete with the counts and the reason; "all pass" nowhere."""
    data = json.loads((outdir / "results.json").read_text())
    assert data["run"] == {
        "complete": False,
        "selected": SELECTED,
        "finished": finished,
        "stopped": why,
        "shard": None,
    }
    assert len(data["results"]) >= FAST
    headline = f"INCOMPLETE: {finished} of {SELECTED} selected tests finished; {why}"
    for name in ("summary.md", "index.html"):
        text = (outdir / name).read_text()
        assert headline in text, name
        assert "all pass" not in text, name
        assert render.NONE_FAILING_SO_FAR in text, name
    return data


@pytest.mark.parametrize(
    ("sig", "why"),
    [(signal.SIGTERM, "stopped by SIGTERM"), (signal.SIGINT, "interrupted (SIGINT, Ctrl-C)")],
    ids=["SIGTERM", "SIGINT"],
)
def test_a_signalled_run_keeps_every_finished_verdict_and_says_it_is_incomplete(
    slow_run: Callable[..., Run], sig: signal.Signals, why: str
) -> None:
    run = slow_run()
    run.wait_for_fast_tests()
    run.proc.send_signal(sig)
    out = run.finish()
    assert run.proc.returncode == pytest.ExitCode.INTERRUPTED, out
    data = assert_incomplete(run.outdir, FAST, why)
    assert {row["nodeid"].split("::")[-1] for row in data["results"]} == {  # type: ignore[attr-defined]
        f"test_fast[{n}]" for n in range(FAST)
    }
    assert f"INCOMPLETE: {FAST} of {SELECTED} selected tests finished; {why}" in out
    assert "all pass" not in out
    ended = [json.loads(line) for line in (run.outdir / stream.NAME).read_text().splitlines()][-1]
    assert ended["end"]["stopped"] == why


def test_sigterm_on_the_reference_suite_keeps_what_finished(slow_run: Callable[..., Run]) -> None:
    float32 = "(colliding_literals or kv_cache) and not in_bf16 and not in_fp16"
    run = slow_run(str(ROOT / "conformance"), "-k", float32)
    run.wait_for(lambda: streamed_tests(run.outdir) >= 4, "4 tests finished")
    run.proc.send_signal(signal.SIGTERM)
    out = run.finish()
    assert run.proc.returncode == pytest.ExitCode.INTERRUPTED, out
    data = json.loads((run.outdir / "results.json").read_text())
    finished = streamed_tests(run.outdir)
    assert data["run"] == {
        "complete": False,
        "selected": 28,
        "finished": finished,
        "stopped": "stopped by SIGTERM",
        "shard": None,
    }
    assert len({row["nodeid"] for row in data["results"]}) == finished >= 4
    summary = (run.outdir / "summary.md").read_text()
    assert f"INCOMPLETE: {finished} of 28 selected tests finished; stopped by SIGTERM" in summary
    assert "all pass" not in summary


def test_a_second_sigint_stops_at_once(slow_run: Callable[..., Run]) -> None:
    """The first one writes the reports, then waits for the busy worker; the second ends the wait."""
    run = slow_run()
    run.wait_for_fast_tests()
    run.proc.send_signal(signal.SIGINT)
    run.wait_for(lambda: (run.outdir / "summary.md").exists(), "the reports were written")
    run.proc.send_signal(signal.SIGINT)
    out = run.finish()
    assert run.proc.returncode == -signal.SIGINT, out  # died of the second one, not waiting for the worker
    assert_incomplete(run.outdir, FAST, "interrupted (SIGINT, Ctrl-C)")


def test_a_killed_run_leaves_its_verdicts_for_report_render(
    slow_run: Callable[..., Run], capsys: pytest.CaptureFixture[str]
) -> None:
    run = slow_run()
    run.wait_for_fast_tests()
    workers = children(run.proc.pid)
    run.proc.send_signal(signal.SIGKILL)
    run.finish()
    for pid in workers:  # its test sleeps on
        os.kill(pid, signal.SIGKILL)
    assert sorted(os.listdir(run.outdir)) == [stream.NAME]

    assert ptn_cli(["report", "render", str(run.outdir)]) == 0
    printed = capsys.readouterr().out
    assert_incomplete(run.outdir, FAST, stream.KILLED)
    assert f"INCOMPLETE: {FAST} of {SELECTED} selected tests finished" in printed


def test_maxfail_under_xdist_is_incomplete(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:randomly")
    pytester.makepyfile(
        test_e1="""
        import pytest

        @pytest.mark.E1
        @pytest.mark.parametrize("n", range(4))
        def test_e1(n):
            assert n != 1
        """
    )
    result = pytester.runpytest_subprocess(
        "test_e1.py",
        "--ptn-backend=reference",
        "-p",
        "no:cacheprovider",
        "--maxfail=1",
        "--ptn-report",
        "out",
    )
    assert result.ret != 0
    data = json.loads((pytester.path / "out" / "results.json").read_text())
    assert data["run"]["complete"] is False
    assert data["run"]["stopped"] == "stopping after 1 failures"
    assert data["run"]["finished"] == 2 and data["run"]["selected"] == 4


def test_a_worker_pool_that_gave_up_is_incomplete(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:randomly")
    pytester.makepyfile(
        test_e1="""
        import os
        import signal

        import pytest

        @pytest.mark.E1
        @pytest.mark.parametrize("n", range(3))
        def test_e1(n):
            if n == 1:
                os.kill(os.getpid(), signal.SIGSEGV)
        """
    )
    result = pytester.runpytest_subprocess(
        "test_e1.py",
        "--ptn-backend=reference",
        "-p",
        "no:cacheprovider",
        "--max-worker-restart=0",
        "--ptn-report",
        "out",
    )
    assert result.ret != 0
    data = json.loads((pytester.path / "out" / "results.json").read_text())
    why = "the run ended early after 1 xdist worker crashed"
    assert data["run"] == {"complete": False, "selected": 3, "finished": 2, "stopped": why, "shard": None}
    assert sorted(row["outcome"] for row in data["results"]) == ["fail", "pass"]  # the crash is a verdict


def test_exitfirst_in_process_is_incomplete(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_e1="""
        import pytest

        @pytest.mark.E1
        @pytest.mark.parametrize("n", range(4))
        def test_e1(n):
            assert n != 0
        """
    )
    result = pytester.runpytest(
        "test_e1.py", "--ptn-backend=reference", "-p", "no:cacheprovider", "-x", "--ptn-report", "out"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["INCOMPLETE: 1 of 4 selected tests finished; stopping after 1 failures"])
    md = (pytester.path / "out" / "summary.md").read_text()
    assert "INCOMPLETE: 1 of 4 selected tests finished; stopping after 1 failures" in md


def test_a_complete_run_says_so_and_ends_its_stream(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_e1="import pytest\n\n@pytest.mark.E1\ndef test_e1():\n    pass\n")
    result = pytester.runpytest(
        "test_e1.py", "--ptn-backend=reference", "-p", "no:cacheprovider", "--ptn-report", "out"
    )
    assert result.ret == 0
    out = pytester.path / "out"
    run = json.loads((out / "results.json").read_text())["run"]
    assert run == {"complete": True, "selected": 1, "finished": 1, "stopped": None, "shard": None}
    assert "**MUST: all pass**" in (out / "summary.md").read_text()
    assert "INCOMPLETE" not in result.stdout.str()
    assert stream.read(out / stream.NAME) == results.load(out / "results.json")


def test_reports_of_an_earlier_run_go_when_a_run_starts(pytester: pytest.Pytester) -> None:
    """A killed run must not leave the last complete run's summary looking like its own."""
    out = pytester.path / "out"
    out.mkdir()
    for name in render.REPORT_FILES:
        (out / name).write_text("an earlier run")
    pytester.makeconftest(
        "def pytest_collection_finish(session):\n"
        "    import os\n"
        "    assert sorted(os.listdir('out')) == ['verdicts.jsonl'], os.listdir('out')\n"
    )
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    result = pytester.runpytest(
        "test_plain.py", "--ptn-backend=reference", "-p", "no:cacheprovider", "--ptn-report", "out"
    )
    assert result.ret == 0, result.stdout.str()


# --- the stream and the run status as data -------------------------------------------------------------


def row(nodeid: str, outcome: str = results.PASS) -> results.Result:
    return results.Result("E1", "MUST", "kv_cache", "reference", outcome, "", "pytest x", None, nodeid)


def test_a_stream_cut_short_mid_line_reads_back(tmp_path: Path) -> None:
    path = tmp_path / stream.NAME
    writer = stream.VerdictStream(path, SPEC_VERSION, {"torch": "2.13.0"}, "2/3")
    writer.selected(3)
    writer.test("t::a", [row("t::a")])
    writer.test("t::b", [row("t::b", results.FAIL)])
    with path.open("a") as f:
        f.write('{"test": "t::c", "rows": [{"rule"')  # a kill in the middle of a write
    doc = stream.read(path)
    assert [r.nodeid for r in doc.results] == ["t::a", "t::b"]
    assert doc.run == results.RunStatus(3, 2, stream.KILLED, "2/3")
    assert doc.provenance == {"torch": "2.13.0"}


def test_a_stream_damaged_before_its_last_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / stream.NAME
    writer = stream.VerdictStream(path, SPEC_VERSION, {}, None)
    writer.test("t::a", [row("t::a")])
    path.write_text(path.read_text().replace('"rows"', "rows", 1) + '{"selected": 1}\n')
    with pytest.raises(results.ResultsFormatError, match=":2: not JSON"):
        stream.read(path)
    (tmp_path / "other.jsonl").write_text('{"schema": "something else"}\n')
    with pytest.raises(results.ResultsFormatError, match="not a pytest-ptn/verdicts stream"):
        stream.read(tmp_path / "other.jsonl")


def test_render_of_a_folder_without_a_stream_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ptn_cli(["report", "render", str(tmp_path)]) == 2
    assert "verdicts.jsonl" in capsys.readouterr().err


def test_the_run_status_round_trips_and_is_validated() -> None:
    doc = results.Results(
        SPEC_VERSION, {}, [row("t::a")], run=results.RunStatus(9, 1, "stopped by SIGTERM", "1/2")
    )
    data = results.to_dict(doc)
    assert data["run"] == {
        "complete": False,
        "selected": 9,
        "finished": 1,
        "stopped": "stopped by SIGTERM",
        "shard": "1/2",
    }
    assert results.from_dict(data) == doc
    for bad in (
        {**data["run"], "shard": "3/2"},
        {**data["run"], "finished": -1},
        {**data["run"], "stopped": None},
    ):
        with pytest.raises(results.ResultsFormatError, match="run"):
            results.from_dict({**data, "run": bad})
    without = {k: v for k, v in data.items() if k != "run"}  # a file from before runs were recorded
    assert results.from_dict(without).complete


def test_no_rendering_says_all_pass_over_an_incomplete_run() -> None:
    run = results.RunStatus(274, 121, "stopped by SIGTERM")
    doc = results.Results(SPEC_VERSION, {}, [row("t::a")], run=run)
    headline = "INCOMPLETE: 121 of 274 selected tests finished; stopped by SIGTERM"
    text = "\n".join(render.render_text(doc))
    for rendered in (text, render.render_markdown(doc), render.render_html(doc)):
        assert headline in rendered
        assert "all pass" not in rendered
    complete = results.Results(SPEC_VERSION, {}, [row("t::a")], run=results.RunStatus(1, 1))
    assert "all pass" in render.render_markdown(complete) and "INCOMPLETE" not in render.render_markdown(
        complete
    )


# --- merging shards ------------------------------------------------------------------------------------


def shard_file(tmp_path: Path, shard: str, run: results.RunStatus) -> str:
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / f"shard{shard.replace('/', 'of')}.json"
    results.save(results.Results(SPEC_VERSION, {}, [row(f"t::{shard}")], run=run), path)
    return str(path)


def test_a_merge_names_a_missing_shard_and_an_incomplete_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = [
        shard_file(tmp_path, "1/4", results.RunStatus(10, 10, None, "1/4")),
        shard_file(tmp_path, "3/4", results.RunStatus(10, 4, "stopped by SIGTERM", "3/4")),
        shard_file(tmp_path, "4/4", results.RunStatus(10, 10, None, "4/4")),
    ]
    assert ptn_cli(["report", "merge", *files, "-o", str(tmp_path / "merged")]) == 0
    headline = "INCOMPLETE: 24 tests finished; shard 2/4 missing; shard 3/4: stopped by SIGTERM"
    assert headline in capsys.readouterr().out
    merged = results.load(tmp_path / "merged" / "results.json")
    assert merged.run == results.RunStatus(None, 24, "shard 2/4 missing; shard 3/4: stopped by SIGTERM")
    md = (tmp_path / "merged" / "summary.md").read_text()
    assert headline in md and "all pass" not in md


def test_a_merge_of_every_complete_shard_is_complete(tmp_path: Path) -> None:
    """Also when a shard that stopped was run again and its new report merged after the old one."""
    stopped = shard_file(tmp_path / "first", "2/2", results.RunStatus(3, 1, "stopped by SIGTERM", "2/2"))
    files = [shard_file(tmp_path, f"{k}/2", results.RunStatus(3, 3, None, f"{k}/2")) for k in (1, 2)]
    assert ptn_cli(["report", "merge", stopped, *files, "-o", str(tmp_path / "merged")]) == 0
    merged = results.load(tmp_path / "merged" / "results.json")
    assert merged.run == results.RunStatus(6, 6)
    assert "**MUST: all pass**" in (tmp_path / "merged" / "summary.md").read_text()


@pytest.mark.parametrize("option", ["--collect-only", "--fixtures"])
def test_runs_that_run_no_test_are_not_incomplete(pytester: pytest.Pytester, option: str) -> None:
    pytester.makepyfile(test_e1="import pytest\n\n@pytest.mark.E1\ndef test_e1():\n    pass\n")
    result = pytester.runpytest("test_e1.py", option, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK
    assert "INCOMPLETE" not in result.stdout.str()
