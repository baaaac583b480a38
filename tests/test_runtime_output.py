"""What a backend's runtime says while the suite runs it: its output once in the failures and whole in each
test's log (pytest_ptn.reporting.runtime_log), and its warnings told as its own, never the harness's
(pytest_ptn.upstream_noise.author).

The talkative runtime below logs on every load as a C++ runtime does: to descriptor 2, through
``sys.stderr`` (as executorch's bindings write ``ET_LOG``), and from a child process that inherits the
descriptor; it warns as adapters do (a deprecation blaming its caller, ``stacklevel=2``) and leaves a child
process running for its finalizer to warn about. It binds constants by key, so the colliding scenario fails
E1 (both load schedules) and the failures show what it said."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
RUNTIME = "talkative_runtime:TalkativeRuntime"
SELECTION = ("-m", "E1", "-k", "colliding_literals and not bf16 and not fp16", "-p", "no:cacheprovider")

TALKATIVE_RUNTIME = """
import itertools
import os
import subprocess
import sys
import warnings

from broken_backends import BindsByKey

LOADS = itertools.count(1)


class TalkativeRuntime(BindsByKey):
    name = "talkative"

    def load(self, lowered):
        os.write(2, b"[runtime.cpp:12] runtime initialised\\n")
        sys.stderr.write("[method.cpp:40] methods loaded\\n")
        child = "import os; os.write(2, b'[server.cpp:7] server up\\\\n')"
        subprocess.run([sys.executable, "-c", child], check=True)
        os.write(2, f"[program.cpp:99] load #{next(LOADS)}\\n".encode())
        warnings.warn("talkative: load() is deprecated", DeprecationWarning, stacklevel=2)
        loaded = super().load(lowered)
        loaded.server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
        return loaded
"""
SAID = ("[runtime.cpp:12] runtime initialised", "[method.cpp:40] methods loaded", "[server.cpp:7] server up")
"""What the runtime says on every load, the same each time."""
WARN_LINE = 1 + TALKATIVE_RUNTIME.splitlines().index(
    '        warnings.warn("talkative: load() is deprecated", DeprecationWarning, stacklevel=2)'
)


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str) -> pytest.RunResult:
    (pytester.path / "talkative_runtime.py").write_text(TALKATIVE_RUNTIME)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(pytester.path), str(TESTS)]))
    return pytester.runpytest_subprocess(f"--ptn-backend={RUNTIME}", *SELECTION, *args)


def sections(text: str) -> dict[str, str]:
    """The failures' sections (``----- title -----``) by title, of the failure each follows, in order:
    "test id / title" -> the section's text."""
    found: dict[str, str] = {}
    test = ""
    for block in re.split(r"\n(?=_+ \S.* _+\n|-{3,} .+ -{3,}\n|={3,} )", text):
        head, _, body = block.partition("\n")
        if head.startswith("_"):
            test = head.strip("_ ")
        elif head.startswith("-"):
            found[f"{test} / {head.strip('- ')}"] = body
    return found


def test_the_runtime_output_is_shown_once_and_kept_whole_for_each_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, monkeypatch, "--ptn-report", "out")
    assert result.parseoutcomes().get("failed") == 2, result.stdout.str()
    output = result.stdout.str()
    for line in SAID:
        assert output.count(line) == 1, output  # once, not in every failure
    runtime = {
        title: body for title, body in sections(output).items() if title.endswith("(stdout and stderr)")
    }
    assert len(runtime) == 2, output
    first, second = runtime.values()
    assert all(line in first for line in SAID), output
    assert "lines as shown for test_each_method_matches_eager[" in second, output
    assert not [
        body for title, body in sections(output).items() if "Captured" in title and "server up" in body
    ]
    logs = [
        Path(line.split(": ", 1)[1])
        for body in runtime.values()
        for line in body.splitlines()
        if line.startswith("the whole log (")
    ]
    assert [log.parent for log in logs] == [pytester.path / "out" / "runtime-logs"] * 2, output
    loads = set()
    for log, body in zip(logs, runtime.values(), strict=True):
        text = log.read_text()
        assert all(line in text for line in SAID), text
        (load,) = re.findall(r"\[program.cpp:99\] load #\d+", text)
        assert load in body, output  # what only this test's runtime said is in its failure
        loads.add(load)
    assert len(loads) == 2


def test_the_adapters_warnings_are_told_as_its_own(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted (by default) under the adapter's package, the deprecation that blames its caller and the
    finalizer's warning of the process it left running too; shown (``--ptn-upstream-logs``) at the
    adapter's line, not at the harness line that called it."""
    counted = run(pytester, monkeypatch).stdout.str()
    tally = next(line for line in counted.splitlines() if " upstream warnings while " in line)
    assert "DeprecationWarning x2 from talkative_runtime" in tally, tally
    assert "ResourceWarning x2 from talkative_runtime" in tally, tally
    assert not re.search(r"from (pytest_ptn|conformance|_pytest)\b", tally), tally

    shown = run(pytester, monkeypatch, "--ptn-upstream-logs").stdout.str()
    summary = shown.split("warnings summary", 1)[1]
    where = f"talkative_runtime.py:{WARN_LINE}: DeprecationWarning: talkative: load() is deprecated"
    assert where in summary, summary
    assert not re.search(r"pytest_ptn/\S+: DeprecationWarning: talkative", summary), summary
