"""Failures keep their whole finding: every mismatch line in every report, a program printed once, reproduce
commands that run from any folder, no failed test left out of the matrix, and bad report input stopped early.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from test_report import CONFTEST, make_run, run

from pytest_ptn.cli.main import main
from pytest_ptn.reporting import render, results


@pytest.fixture(scope="module")
def warm(warm_torch: None) -> None:
    """Torch and hypothesis imported once, before the in-process runs (see tests/conftest.py)."""
    import hypothesis  # noqa: F401


def in_process(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """A run of the installed plugin and suite, in this process (``-n 0``: no crash-isolating worker)."""
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-n", "0", *args)


def results_of(path: Path) -> list[dict[str, object]]:
    return json.loads(path.read_text(encoding="utf-8"))["results"]


# --- the whole reason -------------------------------------------------------------------------------------


def test_whole_reason_keeps_every_line_up_to_a_cap() -> None:
    text = "outputs differ from eager:\n" + "\n".join(f"  call #{i} decode(): value 0" for i in range(50))
    assert results.whole_reason("\n  head:\n  one\n\n") == "  head:\n  one"
    capped = results.whole_reason(text).splitlines()
    assert capped[:2] == ["outputs differ from eager:", "  call #0 decode(): value 0"]
    assert len(capped) == 41 and capped[-2] == "  call #38 decode(): value 0"
    assert capped[-1] == "... 11 more lines"
    by_size = results.whole_reason(text, max_chars=100).splitlines()
    assert by_size == [*text.splitlines()[:3], "... 48 more lines"]
    assert results.whole_reason("x" * 50, max_chars=10) == "xxxxxxx..."


MISMATCHES = [f"call #{i} decode(): value 0 (reads 'kv') is -1.3558, eager 2.5097" for i in range(3)]
MISMATCHES.append("call #3 prefill(): output <script>alert(1)</script> | eager [1.0]")

MULTI_LINE = f"""
import pytest

@pytest.mark.ptn("E1", backend="pte", scenario="kv_cache")
def test_each_method_matches_eager():
    pytest.fail("outputs differ from eager:\\n  " + "\\n  ".join({MISMATCHES!r}), pytrace=False)
"""


def test_every_mismatch_line_reaches_terminal_json_markdown_and_html(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On CI (CI or BUILD_NUMBER set) pytest's own short test summary prints a failure's whole message again,
    # untruncated: that copy is pytest's, not the suite's, so the count is taken as a terminal shows it.
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("BUILD_NUMBER", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_multi=MULTI_LINE)
    result = run(pytester, "--ptn-report", "out")
    result.assert_outcomes(failed=1)
    head = "Failed: outputs differ from eager:"
    # Terminal: every line of the failure once (pytest's FAILURES section), listed under the matrix by its
    # cause and how to rerun it.
    out = result.stdout.lines
    for mismatch in MISMATCHES:
        assert sum(mismatch in line for line in out) == 1, mismatch
    start = out.index("failing tests (1):")
    assert out[start + 1] == "  F E1 on pte · kv_cache (cause 1)"
    assert out[start + 2].startswith("    reproduce: pytest --ptn-backend=pte ")
    [row] = results_of(pytester.path / "out" / "results.json")
    assert row["reason"] == head + "".join(f"\n  {m}" for m in MISMATCHES)
    md = (pytester.path / "out" / "summary.md").read_text(encoding="utf-8")
    cells = "<br>".join(
        [head, *(m.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|") for m in MISMATCHES)]
    )
    assert f"| E1 | pte | kv_cache | fail | {cells} |" in md
    page = (pytester.path / "out" / "index.html").read_text(encoding="utf-8")
    assert "<script>" not in page
    escaped = "\n  ".join(
        m.replace("'", "&#x27;").replace("<", "&lt;").replace(">", "&gt;") for m in MISMATCHES
    )
    assert f'<pre class="reason">{head}\n  {escaped}</pre>' in page


def test_suite_mismatches_of_a_broken_backend_keep_every_call(pytester: pytest.Pytester, warm: None) -> None:
    """The E1 variant reads another method's tensor on two calls: both are the finding."""
    result = in_process(
        pytester,
        "--pyargs",
        "pytest_ptn.conformance.test_execution",
        "--ptn-backend=broken_backends:BindsByKey",
        "-m",
        "E1",
        "-k",
        "cond_constants and up_front",
        "--ptn-report",
        "out",
    )
    result.assert_outcomes(failed=1)
    [row] = results_of(pytester.path / "out" / "results.json")
    lines = str(row["reason"]).splitlines()
    assert lines[0] == "Failed: outputs differ from eager (every method loaded before the first call):"
    assert [line.split(":")[0] for line in lines[1:]] == ["  call #1 decode()", "  call #3 decode()"]


# --- reproduce commands -----------------------------------------------------------------------------------


def test_suite_repro_selects_exactly_its_test_from_any_folder(
    pytester: pytest.Pytester, warm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    test = "test_method_named_state_is_rejected[reference-method_named_state]"
    args = ("--pyargs", "pytest_ptn.conformance.test_rejection", "-m", "P6")
    result = in_process(pytester, *args, "--ptn-backend=reference", "--ptn-report", "out")
    result.assert_outcomes(passed=1)
    [row] = results_of(pytester.path / "out" / "results.json")
    repro = f"pytest --pyargs 'pytest_ptn.conformance.test_rejection::{test}' --ptn-backend=reference"
    assert row["repro"] == repro
    monkeypatch.chdir(pytester.mkdir("elsewhere"))
    rerun = in_process(pytester, *shlex.split(repro)[1:], "-v")
    rerun.assert_outcomes(passed=1)
    rerun.stdout.fnmatch_lines([f"*::{test.replace('[', '[[]')} PASSED*"])


def test_local_repro_is_relative_to_the_invocation_folder(
    pytester: pytest.Pytester, warm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeini("[pytest]\n")  # rootdir stays here while pytest starts in checks/
    checks = pytester.mkdir("checks")
    (checks / "test_mine.py").write_text(
        "import pytest\n\n\n@pytest.mark.X1\ndef test_mine(ptn_backend):\n    pass\n"
    )
    monkeypatch.chdir(checks)
    result = in_process(pytester, ".", "--ptn-backend=reference", "--ptn-report", "out")
    result.assert_outcomes(passed=1)
    [row] = results_of(checks / "out" / "results.json")
    assert row["nodeid"] == "checks/test_mine.py::test_mine[reference]"
    assert row["repro"] == "pytest 'test_mine.py::test_mine[reference]' --ptn-backend=reference"
    in_process(pytester, *shlex.split(str(row["repro"]))[1:]).assert_outcomes(passed=1)


# --- fuzz failures ----------------------------------------------------------------------------------------

FAILING_BACKENDS = """
from pytest_ptn.backend import Loaded
from pytest_ptn.backends.reference import ReferenceBackend


class RejectsCollisions(ReferenceBackend):
    name = "rejects-collisions"

    def lower(self, programs, workdir):
        raise ValueError("constant 'w' differs between methods 'decode' and 'prefill'")


class OffByOne(Loaded):
    # right for a method alone; once another method of the program is loaded, every output is off by one

    def __init__(self, loaded):
        self.loaded = loaded
        self.methods = set()

    def load_method(self, method):
        self.methods.add(method)
        self.loaded.load_method(method)

    def run(self, method, inputs):
        self.methods.add(method)
        outputs = self.loaded.run(method, inputs)
        return [t + 1 for t in outputs] if len(self.methods) > 1 else outputs


class WrongOutputs(ReferenceBackend):
    name = "wrong-outputs"

    def load(self, lowered):
        return OffByOne(super().load(lowered))
"""


def failure_section(result: pytest.RunResult) -> str:
    out = result.stdout.str()
    return out[out.index("= FAILURES =") : out.index("ptn conformance (spec")]


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        ("ptn_failing_backends:WrongOutputs", "outputs differ from eager:\n  call #0 "),
        (
            "ptn_failing_backends:RejectsCollisions",
            "lowering failed: ValueError: constant 'w' differs between methods 'decode' and 'prefill'\n\n",
        ),
    ],
    ids=["mismatch", "lowering-error"],
)
def test_fuzz_failure_prints_its_program_once_as_a_test(
    pytester: pytest.Pytester, warm: None, backend: str, message: str
) -> None:
    pytester.makepyfile(ptn_failing_backends=FAILING_BACKENDS)
    pytester.syspathinsert()
    fuzz = "pytest_ptn.conformance.test_fuzz"
    result = in_process(pytester, "--pyargs", fuzz, f"--ptn-backend={backend}", "--ptn-report", "out")
    result.assert_outcomes(failed=1)
    failure = failure_section(result)
    assert message in failure
    assert failure.count("def test_reproducer(") == 1 and failure.count("ProgramSpec(") == 1
    assert f"the program, as a test (run with --ptn-backend={backend}):" in failure
    for noise in ("Traceback", "Falsifying example", "reproduce_failure", "test_fuzz.py:"):
        assert noise not in result.stdout.str()
    [row] = results_of(pytester.path / "out" / "results.json")
    assert str(row["reason"]).count("def test_reproducer(") == 1  # whole: the program fits the cap
    # The printed test is the program: pasted into a file, it fails the same way.
    last = '    fail_on(check_spec(ptn_backend, spec, tmp_path), "outputs differ from eager")\n'
    test = failure[failure.index("from pytest_ptn import") : failure.index(last) + len(last)]
    pytester.makepyfile(test_pasted=test)
    pasted = in_process(pytester, "test_pasted.py", f"--ptn-backend={backend}")
    pasted.assert_outcomes(failed=1)
    assert message.split("\n")[0] in pasted.stdout.str()


# --- verdicts ---------------------------------------------------------------------------------------------


def test_a_level_where_nothing_ran_is_not_applicable_not_all_pass() -> None:
    doc = make_run("native", {"P1": "pass", "P9": "not_applicable", "S7": "not_applicable"}, "t")
    md, page = render.render_markdown(doc), render.render_html(doc)
    assert "**MUST: all pass** · **SHOULD: not applicable**" in md
    assert '<span class="na">SHOULD: not applicable</span>' in page
    assert "SHOULD: all pass" not in md + page
    ran = make_run("native", {"P1": "pass", "P9": "pass", "S7": "not_applicable"}, "t")
    assert "**SHOULD: all pass**" in render.render_markdown(ran)


# --- failures without ptn properties ----------------------------------------------------------------------

OUTSIDE = """
import pytest

@pytest.mark.ptn("P1", backend="native", scenario="colliding_literals")
def test_namespace_native():
    pass

@pytest.mark.parametrize("case", ["native-kv_cache"])
def test_crashed(case):
    # What xdist reports for a worker that died: a failure without the test's user_properties.
    raise SystemError("worker 'gw0' crashed while running this test")

def test_plain_helper_fails():
    assert False, "a helper broke"
"""


def test_a_failed_test_without_properties_is_counted_as_a_failure(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_outside=OUTSIDE, test_broken_module="import nonexistent_module_xyz\n")
    result = run(pytester, "--ptn-report", "out", "--continue-on-collection-errors")
    result.assert_outcomes(passed=1, failed=2, errors=1)
    result.stdout.re_match_lines([r"  \?\s+rules unknown: a test failed\s+2F\s+1F$"])
    rows = {row["nodeid"]: row for row in results_of(pytester.path / "out" / "results.json")}
    crashed = rows["test_outside.py::test_crashed[native-kv_cache]"]
    assert (crashed["rule"], crashed["level"], crashed["backend"], crashed["outcome"]) == (
        "?",
        "MUST",
        "native",
        "fail",
    )
    assert crashed["reason"] == "SystemError: worker 'gw0' crashed while running this test"
    helper = rows["test_outside.py::test_plain_helper_fails"]
    assert (helper["rule"], helper["backend"]) == ("?", "(no backend)")
    module = rows["test_broken_module.py"]
    assert module["rule"] == "?" and str(module["reason"]).startswith("collect: ")
    assert "nonexistent_module_xyz" in str(module["reason"])
    md = (pytester.path / "out" / "summary.md").read_text(encoding="utf-8")
    assert "**MUST: 2 failing** (? on (no backend), ? on native)" in md
    assert "all pass" not in md
    assert "| **?** rules unknown: a test failed |" in md
    assert results.load(pytester.path / "out" / "results.json").results


def test_runs_without_conformance_tests_get_no_matrix_of_their_failures(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile("def test_plain():\n    assert False\n")
    result = run(pytester)
    result.assert_outcomes(failed=1)
    assert "ptn conformance" not in result.stdout.str()
    reported = run(pytester, "--ptn-report", "out")  # asked for a report: the failure is in it
    assert "ptn conformance" in reported.stdout.str()
    assert "**MUST: 1 failing**" in (pytester.path / "out" / "summary.md").read_text(encoding="utf-8")


# --- --ptn-report checked up front --------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["existing-file", "under-a-file", "read-only-folder"])
def test_unusable_report_folder_is_a_one_line_usage_error(pytester: pytest.Pytester, case: str) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile("def test_plain():\n    pass\n")
    (pytester.path / "report.txt").write_text("not a folder")
    target, phrase = {
        "existing-file": ("report.txt", "is a file, not a folder"),
        "under-a-file": ("report.txt/out", "cannot write there: Not a directory"),
        "read-only-folder": ("locked/out", "cannot write there: Permission denied"),
    }[case]
    if case == "read-only-folder":
        locked = pytester.mkdir("locked")
        locked.chmod(0o500)
        if os.access(locked, os.W_OK):
            pytest.skip("this user writes into read-only folders (root)")
    result = run(pytester, "--ptn-report", target)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.strip()]
    assert errors == [f"ERROR: --ptn-report {target}: {phrase}"]
    assert "passed" not in result.stdout.str()


# --- report merge input -----------------------------------------------------------------------------------


def results_text(**row_changes: object) -> str:
    data = results.to_dict(make_run("native", {"E1": "fail"}, "t"))
    data["results"][0].update(row_changes)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("content", "phrase"),
    [
        (results_text(rule=5), "rule must be str, not 5"),
        (results_text(backend=["pte"]), "backend must be str, not ['pte']"),
        (results_text(level=7), "level must be str, not 7"),
        (results_text(level="MAY"), "level must be one of MUST, SHOULD, not 'MAY'"),
        (results_text(seed=True), "seed must be int or null, not True"),
        ("[" * 200_000 + "]" * 200_000, "JSON nested too deeply to read"),
        (b"\xff\xfe{}", "not UTF-8 text"),
    ],
    ids=["rule-number", "backend-list", "level-7", "level-unknown", "seed-bool", "deep-nesting", "not-utf8"],
)
def test_merge_rejects_bad_input_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | bytes, phrase: str
) -> None:
    path = tmp_path / "results.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    assert main(["report", "merge", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and err.count("\n") == 1, err
    assert phrase in err
    assert not (tmp_path / "out").exists()


VERSION_1_FILE = {
    "schema": "pytest-ptn/results",
    "version": 1,
    "spec_version": "1",
    "provenance": {"pytest_ptn": "0.1.0", "device": "cpu"},
    "results": [
        {
            "rule": "E1",
            "level": "MUST",
            "scenario": "kv_cache",
            "backend": "pte",
            "outcome": "fail",
            "reason": "Failed: outputs differ from eager:",
            "repro": "pytest '/venv/site-packages/conformance/test_execution.py::test_x[pte-kv_cache]'",
            "seed": None,
            "nodeid": "test_execution.py::test_x[pte-kv_cache]",
        }
    ],
}


def test_merge_reads_files_of_earlier_runs(tmp_path: Path) -> None:
    (tmp_path / "old.json").write_text(json.dumps(VERSION_1_FILE), encoding="utf-8")
    assert main(["report", "merge", str(tmp_path / "old.json"), "-o", str(tmp_path / "out")]) == 0
    assert (
        results.load(tmp_path / "out" / "results.json").results[0].reason
        == "Failed: outputs differ from eager:"
    )
