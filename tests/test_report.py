"""The conformance report: terminal matrix, results.json/summary.md/index.html, xdist, merge/diff, JUnit.

Self-contained: each pytester run gets a conftest that wires pytest_ptn.reporting.collect in by hand and
stamps user_properties from a marker the way the real plugin does, so these tests do not depend on plugin.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_ptn.cli.main import main
from pytest_ptn.reporting import render, results, stream
from pytest_ptn.reporting.matrix import build_matrix
from pytest_ptn.ruleset import RULES, SPEC_VERSION

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = """
import pytest
from pytest_ptn.reporting import collect
from pytest_ptn.ruleset import RULES, SHOULD, should_not_met
from pytest_ptn.run.not_applicable import OUTCOME_PROPERTY, is_not_applicable

def pytest_addoption(parser):
    collect.add_options(parser.getgroup("ptn"))

def pytest_configure(config):
    config.addinivalue_line("markers", "ptn(rules, backend, scenario=None, seed=None): conformance metadata")
    collect.configure(config)

def pytest_collection_modifyitems(items):
    for item in items:
        mark = item.get_closest_marker("ptn")
        if mark is None:
            continue
        props = [("ptn_rule", rule) for rule in mark.args[0].split()]
        props.append(("ptn_backend", mark.kwargs["backend"]))
        if mark.kwargs.get("scenario"):
            props.append(("ptn_scenario", mark.kwargs["scenario"]))
        if mark.kwargs.get("seed") is not None:
            props.append(("ptn_seed", str(mark.kwargs["seed"])))
        props.append(("ptn_repro", f"pytest --ptn-backend={mark.kwargs['backend']} '{item.nodeid}'"))
        item.user_properties.extend(props)

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # As plugin.py does: a failed SHOULD test must not fail the run; a not applicable one is marked.
    report = (yield).get_result()
    if call.excinfo is not None and is_not_applicable(call.excinfo.value):
        report.user_properties.append((OUTCOME_PROPERTY, "not_applicable"))
    mark = item.get_closest_marker("ptn")
    if mark and report.when == "call" and report.failed:
        rules = mark.args[0].split()
        if all(RULES[r].level == SHOULD for r in rules):
            report.outcome = "skipped"
            report.wasxfail = should_not_met(rules)
            report.user_properties.append((OUTCOME_PROPERTY, "fail"))
"""

SUITE = """
import pytest
from pytest_ptn.run.not_applicable import skip_not_applicable

ptn = pytest.mark.ptn

@ptn("P1 P3", backend="reference", scenario="colliding_literals")
def test_namespace_reference():
    pass

@ptn("P1", backend="reference", scenario="single_method")
def test_namespace_single_reference():
    pass

@ptn("E1", backend="reference", scenario="kv_cache", seed=1234)
def test_isolation_reference():
    assert 1 == 2, "decode read prefill/_lifted_tensor_constant0 | wrong weights"

@ptn("E1", backend="native", scenario="colliding_lifted_tensor")
@pytest.mark.xfail(reason="native: constant 'lifted_tensor_0' differs between methods", strict=True)
def test_isolation_native():
    raise ValueError("constant 'lifted_tensor_0' differs between methods")

@ptn("E3", backend="native", scenario="user_input_mutation")
@pytest.mark.xfail(reason="thought broken", strict=False)
def test_unexpected_pass_native():
    pass

@ptn("E4", backend="native", scenario="private_buffers")
@pytest.mark.xfail(reason="buffers alias", strict=True)
def test_strict_unexpected_pass_native():
    pass

@ptn("S1", backend="native")
def test_sharing_native():
    skip_not_applicable("native loader cannot show storage")

@ptn("P9", backend="reference", scenario="colliding_literals")
def test_deterministic_reference():
    pass

@ptn("P9", backend="native", scenario="colliding_literals")
def test_deterministic_native():
    assert False, "package bytes differ at offset 12"

@ptn("P10", backend="native")
def test_atomic_native():
    pytest.skip("needs a writable tmpfs")

@pytest.fixture
def broken():
    raise RuntimeError("could not lower")

@ptn("E2", backend="native", scenario="kv_cache")
def test_setup_error_native(broken):
    pass

def test_not_conformance():
    pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    # xdist workers are fresh interpreters: they must find pytest_ptn even when it is not installed.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("-p", "no:ptn", "-p", "no:cacheprovider", *args)


def matrix_line(result: pytest.RunResult, rule: str) -> str:
    lines = [ln for ln in result.outlines if re.match(rf"\s+{rule}\s", ln)]
    assert len(lines) == 1, result.outlines
    return lines[0]


def test_terminal_matrix(suite: pytest.Pytester) -> None:
    result = run(suite)
    result.assert_outcomes(passed=4, failed=2, errors=1, skipped=2, xfailed=2, xpassed=1)
    out = result.stdout.str()
    assert f"ptn conformance (spec v{SPEC_VERSION})" in out
    header = next(ln for ln in result.outlines if "reference" in ln and "native" in ln)
    assert header.index("reference") < header.index("native")
    assert out.index("MUST rules") < out.index("SHOULD rules")
    # Columns: reference then native; "." where a rule was not tested on a backend.
    assert matrix_line(result, "P1").split()[-2:] == ["2p", "."]
    assert re.search(r"E1\s+isolation\s+1F\s+1x$", matrix_line(result, "E1"))
    assert re.search(r"E2\s+valid programs load\s+\.\s+1F$", matrix_line(result, "E2"))
    assert re.search(r"E3\s+shared state\s+\.\s+1X$", matrix_line(result, "E3"))
    assert re.search(r"E4\s+private state\s+\.\s+1X$", matrix_line(result, "E4"))
    assert matrix_line(result, "S1").split()[-2:] == [".", "1-"]
    assert matrix_line(result, "P10").split()[-2:] == [".", "1s"]
    assert matrix_line(result, "P9").split()[-2:] == ["1p", "1F"]
    assert out.index("P10") > out.index("SHOULD rules") > out.index("S1 ")
    assert "legend: F fail" in out


PASSING = """
import pytest

@pytest.mark.ptn("P1", backend="reference", scenario="colliding_literals")
@pytest.mark.parametrize("n", range(6))
def test_passes(n):
    pass
"""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full, a device that is always full")
@pytest.mark.parametrize(
    "full",
    [["verdicts.jsonl", ".results.json.partial"], [".results.json.partial"]],
    ids=["all", "at-the-end"],
)
def test_a_report_folder_that_fills_up_costs_the_report_only(
    pytester: pytest.Pytester, full: list[str]
) -> None:
    """Writes into the folder fail with ENOSPC (files linked to /dev/full): from the start (the verdict stream
    too) or only at the end. Every test runs, the exit status is the tests', one line names the folder and the
    error, and nothing half-written is left."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_passing=PASSING)
    out = pytester.path / "out"
    out.mkdir()
    for name in full:
        (out / name).symlink_to("/dev/full")
    result = run(pytester, "--ptn-report", "out")
    said = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in said and "Traceback" not in said, said
    result.assert_outcomes(passed=6)
    assert result.ret == pytest.ExitCode.OK, said
    errors = [line for line in result.outlines if "[Errno 28]" in line]
    assert errors == [
        f"ptn report: INCOMPLETE: cannot write in {out}: [Errno 28] No space left on device; nothing "
        "half-written is left"
    ], said
    if "verdicts.jsonl" in full:
        assert list(out.iterdir()) == []
    else:  # the stream was written whole: `report render` makes the report from it once there is room
        assert [p.name for p in out.iterdir()] == ["verdicts.jsonl"]
        streamed = stream.read(out / "verdicts.jsonl")
        assert streamed.complete and len(streamed.results) == 6


WAITING = """
import time
from pathlib import Path

import pytest

@pytest.mark.ptn("P1", backend="reference", scenario="colliding_literals")
def test_waits_for_the_other_run():
    deadline = time.monotonic() + 60
    while not Path("released").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
"""


def test_a_report_folder_another_run_writes_is_refused_naming_it(pytester: pytest.Pytester) -> None:
    """The first run holds the folder until it ends: a second one is a usage error naming it, and leaves its
    report alone (it was emptied, and got the second run's results and both runs' verdicts)."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_waiting=WAITING, test_passing=PASSING)
    out = pytester.path / "out"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:ptn", "-p", "no:cacheprovider", "test_waiting.py"]
    with (pytester.path / "first.txt").open("w") as log:
        first = pytester.popen([*cmd, "--ptn-report", "out"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (out / stream.NAME).is_file() or not (out / stream.NAME).read_text().endswith("\n"):
            assert time.monotonic() < deadline and first.poll() is None, "the first run wrote no header"
            time.sleep(0.1)
        second = run(pytester, "test_passing.py", "--ptn-report", "out")
        (pytester.path / "released").touch()
        assert first.wait(timeout=60) == 0, (pytester.path / "first.txt").read_text()
    finally:
        first.kill()
    assert second.ret == pytest.ExitCode.USAGE_ERROR, second.stdout.str()
    named = f"*--ptn-report {out}: in use by another run, pid {first.pid} on *: *test_waiting.py*"
    second.stderr.fnmatch_lines([f"{named}; give each run a folder of its own*"])
    rows = load_rows(out / "results.json")
    assert list(rows) == [("test_waits_for_the_other_run", "P1")], rows
    streamed = stream.read(out / stream.NAME)
    assert streamed.complete and [r.nodeid for r in streamed.results] == [
        "test_waiting.py::test_waits_for_the_other_run"
    ]


def test_no_summary_without_conformance_tests(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile("def test_plain(): pass")
    result = run(pytester)
    assert "ptn conformance" not in result.stdout.str()


def load_rows(path: Path) -> dict[tuple[str, str], dict[str, object]]:
    data = json.loads(path.read_text())
    return {(row["nodeid"].split("::")[-1], row["rule"]): row for row in data["results"]}


def test_results_json(suite: pytest.Pytester) -> None:
    run(suite, "--ptn-report", "out")
    data = json.loads((suite.path / "out" / "results.json").read_text())
    assert data["schema"] == "pytest-ptn/results"
    assert data["version"] == 1
    assert data["spec_version"] == SPEC_VERSION
    prov = data["provenance"]
    assert {"pytest_ptn", "torch", "executorch", "python", "device", "platform", "time"} <= prov.keys()
    assert prov["time"].endswith("+00:00")
    rows = load_rows(suite.path / "out" / "results.json")
    assert len(rows) == 12  # one row per (test, rule); P1 and P3 both come from one test
    fields = {
        "rule",
        "level",
        "scenario",
        "backend",
        "outcome",
        "reason",
        "repro",
        "seed",
        "nodeid",
        "schedule",
        "intermittent",
        "fuzz",
        "mechanisms",
        "whose",
        "owned",
    }
    assert all(set(row) == fields for row in rows.values())
    outcomes = {key: row["outcome"] for key, row in rows.items()}
    assert outcomes == {
        ("test_namespace_reference", "P1"): "pass",
        ("test_namespace_reference", "P3"): "pass",
        ("test_namespace_single_reference", "P1"): "pass",
        ("test_isolation_reference", "E1"): "fail",
        ("test_isolation_native", "E1"): "xfail",
        ("test_unexpected_pass_native", "E3"): "xpass",
        ("test_strict_unexpected_pass_native", "E4"): "xpass",
        ("test_sharing_native", "S1"): "not_applicable",
        ("test_deterministic_reference", "P9"): "pass",
        ("test_deterministic_native", "P9"): "fail",
        ("test_atomic_native", "P10"): "skip",
        ("test_setup_error_native", "E2"): "fail",
    }
    failing = rows[("test_isolation_reference", "E1")]
    assert failing["level"] == "MUST"
    assert failing["seed"] == 1234
    assert failing["scenario"] == "kv_cache"
    assert failing["backend"] == "reference"
    # The whole message, not its first line: pytest's explanation of the assertion is part of the finding.
    assert failing["reason"] == (
        "AssertionError: decode read prefill/_lifted_tensor_constant0 | wrong weights\nassert 1 == 2"
    )
    assert failing["repro"] == "pytest --ptn-backend=reference 'test_suite.py::test_isolation_reference'"
    assert rows[("test_isolation_native", "E1")]["reason"] == (
        "native: constant 'lifted_tensor_0' differs between methods"
    )
    assert (
        rows[("test_sharing_native", "S1")]["reason"] == "not applicable: native loader cannot show storage"
    )
    assert rows[("test_setup_error_native", "E2")]["reason"] == "setup: RuntimeError: could not lower"
    assert rows[("test_strict_unexpected_pass_native", "E4")]["reason"] == "[XPASS(strict)] buffers alias"
    assert rows[("test_unexpected_pass_native", "E3")]["reason"] == "thought broken"
    assert rows[("test_deterministic_reference", "P9")]["level"] == "SHOULD"
    # A SHOULD failure the plugin turned into an xfail is still a failure of that rule, not a known bug.
    assert (
        rows[("test_deterministic_native", "P9")]["reason"]
        == "AssertionError: package bytes differ at offset 12\nassert False"
    )
    assert rows[("test_sharing_native", "S1")]["scenario"] is None
    assert results.load(suite.path / "out" / "results.json").results  # round-trips through the validator


def test_summary_md_and_html(suite: pytest.Pytester) -> None:
    result = run(suite, "--ptn-report", "out")
    result.stdout.fnmatch_lines(
        [f"ptn report: {suite.path / 'out' / 'index.html'} (and results.json, summary.md)"]
    )
    md = (suite.path / "out" / "summary.md").read_text()
    assert md.startswith(f"## pytest-ptn conformance (spec v{SPEC_VERSION})")
    must = "**MUST: 4 failing** (E1 on reference, E2 on native, E3 on native, E4 on native)"
    assert f"{must} · **SHOULD: 1 failing** (P9 on native)" in md
    assert "| rule | reference | native |" in md
    assert "| **E1** isolation | ❌ 1 fail | ⚠️ 1 xfail |" in md
    assert "| **E3** shared state |  | ❌ 1 xpass |" in md
    assert "| **S1** share what is identical |  | ➖ 1 n/a |" in md
    assert "### Failures" in md
    # The pipe inside the assertion message must not split the table row.
    assert "decode read prefill/_lifted_tensor_constant0 \\| wrong weights" in md
    assert "`pytest --ptn-backend=reference 'test_suite.py::test_isolation_reference'`" in md
    assert md.index("### MUST rules") < md.index("### SHOULD rules") < md.index("### Failures")
    page = (suite.path / "out" / "index.html").read_text()
    assert "<script" not in page and "http" not in page.split("</style>")[0]  # self-contained
    e1 = re.search(r"<b>E1</b> isolation</th>(.*?)</tr>", page, re.S)
    assert e1 is not None
    reference_cell, native_cell = re.findall(r"<td class=\"(\w+)\".*?</td>", e1.group(1), re.S)
    assert (reference_cell, native_cell) == ("fail", "xfail")
    assert "<details><summary>" in e1.group(1)
    assert "kv_cache" in e1.group(1) and "seed 1234" in e1.group(1)
    assert "test_suite.py::test_isolation_reference" in e1.group(1)
    assert "lifted_tensor_0&#x27; differs between methods" in e1.group(1)


def test_xdist_gives_same_results(suite: pytest.Pytester) -> None:
    serial = run(suite, "--ptn-report", "serial")
    parallel = run(suite, "-n", "2", "--ptn-report", "parallel")
    parallel.assert_outcomes(passed=4, failed=2, errors=1, skipped=2, xfailed=2, xpassed=1)
    assert f"ptn conformance (spec v{SPEC_VERSION})" in parallel.stdout.str()
    assert (
        json.loads((suite.path / "serial" / "results.json").read_text())["results"]
        == json.loads((suite.path / "parallel" / "results.json").read_text())["results"]
    )
    for rule in ("P1", "E1", "E2", "E3", "E4", "S1", "P9", "P10"):
        assert matrix_line(parallel, rule) == matrix_line(serial, rule)


def test_terminal_colours(suite: pytest.Pytester) -> None:
    result = run(suite, "--color=yes")
    e1 = matrix_line(result, "E1")
    assert "\x1b[31m\x1b[1m1F\x1b[0m" in e1 and "\x1b[33m1x\x1b[0m" in e1


@pytest.mark.parametrize("family", ["xunit1", "xunit2"])
def test_junitxml_carries_rules_and_scenario(suite: pytest.Pytester, family: str) -> None:
    """Properties appear under either family (only xunit1's schema allows them: see reporting/collect.py)."""
    run(suite, "--junitxml=junit.xml", "-o", f"junit_family={family}", "-W", "error::pytest.PytestWarning")
    root = ET.parse(suite.path / "junit.xml").getroot()
    case = next(c for c in root.iter("testcase") if c.get("name") == "test_namespace_reference")
    props = [(p.get("name"), p.get("value")) for p in case.iter("property")]
    assert ("ptn_rule", "P1") in props and ("ptn_rule", "P3") in props
    assert ("ptn_scenario", "colliding_literals") in props
    assert ("ptn_backend", "reference") in props


def make_run(backend: str, outcomes: dict[str, str], time: str) -> results.Results:
    prov = {"pytest_ptn": "0.1.0", "torch": "2.13.0", "executorch": "1.5.1", "device": "cpu", "time": time}
    rows = [
        results.Result(
            rule=rule,
            level=RULES[rule].level,
            scenario="colliding_literals",
            backend=backend,
            outcome=outcome,
            reason="" if outcome == "pass" else f"{rule} broke on {backend}",
            repro=f"pytest --ptn-backend={backend} -k {rule}",
            seed=None,
            nodeid=f"conformance/test_{rule}.py::test[{backend}]",
        )
        for rule, outcome in outcomes.items()
    ]
    return results.Results("1", prov, rows)


def test_merge_and_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reference = make_run("reference", {"P1": "pass", "E1": "pass", "P9": "pass"}, "2025-01-01T00:00:00+00:00")
    native = make_run("native", {"P1": "pass", "E1": "xfail", "P9": "fail"}, "2025-01-01T00:05:00+00:00")
    results.save(reference, tmp_path / "reference.json")
    results.save(native, tmp_path / "native.json")
    inputs = [str(tmp_path / "reference.json"), str(tmp_path / "native.json")]
    assert main(["report", "merge", *inputs, "-o", str(tmp_path / "old")]) == 0
    merged = results.load(tmp_path / "old" / "results.json")
    assert {r.backend for r in merged.results} == {"reference", "native"}
    assert merged.provenance == {
        "pytest_ptn": "0.1.0",
        "torch": "2.13.0",
        "executorch": "1.5.1",
        "device": "cpu",
    }
    assert [s["backends"] for s in merged.sources] == ["reference", "native"]
    out = capsys.readouterr().out
    assert re.search(r"P1\s+method namespace\s+1p\s+1p", out)
    assert re.search(r"E1\s+isolation\s+1p\s+1x", out)
    assert (tmp_path / "old" / "summary.md").exists() and (tmp_path / "old" / "index.html").exists()

    # Next CI run: native regresses on P1, fixes P9; reference gains S1.
    native2 = make_run("native", {"P1": "fail", "E1": "xfail", "P9": "pass"}, "2025-01-02T00:00:00+00:00")
    reference2 = make_run("reference", {"P1": "pass", "E1": "pass", "P9": "pass", "S1": "pass"}, "2025-01-02")
    results.save(native2, tmp_path / "native2.json")
    results.save(reference2, tmp_path / "reference2.json")
    args = ["report", "merge", str(tmp_path / "reference2.json"), str(tmp_path / "native2.json")]
    assert (
        main([*args, "-o", str(tmp_path / "new"), "--previous", str(tmp_path / "old" / "results.json")]) == 0
    )
    out = capsys.readouterr().out
    changes = out.split("changes since")[1].strip().splitlines()[1:4]
    assert [line.split()[:3] for line in changes] == [
        ["newly", "failing", "P1"],
        ["fixed", "P9", "native"],
        ["new", "S1", "reference"],
    ]
    assert "pass -> fail" in changes[0]
    md = (tmp_path / "new" / "summary.md").read_text()
    assert "| newly failing | P1 | native | pass | fail |" in md
    assert "Changes since previous run" in (tmp_path / "new" / "index.html").read_text()


def test_merge_rejects_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.json").write_text(json.dumps({"schema": "pytest-ptn/results", "version": 99}))
    assert main(["report", "merge", str(tmp_path / "bad.json"), "-o", str(tmp_path / "out")]) == 2
    assert "version 99 is not supported" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_module_entry_point(tmp_path: Path) -> None:
    results.save(make_run("reference", {"P1": "pass"}, "t"), tmp_path / "r.json")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    args = ["report", "merge", str(tmp_path / "r.json"), "-o", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_ptn", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "P1  method namespace" in proc.stdout


KNOWN_BUGS = {  # (rule, backend, scenario) -> (outcome, reason), after section 6 of the spec
    ("E1", "native", "colliding_lifted_tensor"): (
        "xfail",
        "constant 'lifted_tensor_0' differs between methods",
    ),
    ("E1", "native", "cond_constants"): ("xfail", "native: no torch.cond program lowers"),
    ("E1", "pte", "external_constants"): (
        "fail",
        "decode output differs: max abs error 3.0 (one .ptd entry)",
    ),
    ("E3", "native", "user_input_mutation"): ("xfail", "native: user-input mutation gives wrong results"),
    ("E4", "pte", "private_buffers"): ("xfail", "Runtime.load_program lets private same-shape buffers alias"),
    ("E5", "native", "nonpersistent_buffer"): (
        "xfail",
        "read-only non-persistent buffer comes back zero-filled",
    ),
    ("P10", "native", "colliding_literals"): ("fail", "existing package truncated after a failed save"),
}


SCENARIOS = {
    "P": ["colliding_literals"],
    "E": ["colliding_literals", "colliding_lifted_tensor", "cond_constants", "external_constants"]
    + ["kv_cache", "user_input_mutation", "private_buffers", "nonpersistent_buffer"],
    "S": ["colliding_literals", "total_collision"],
    "X": ["state_method", "truncated_zip"],
    "A": ["colliding_literals", "cond_constants"],
}


def realistic_results() -> results.Results:
    """Three backends, the rules each can be held to, and the failures real backends show."""
    families = {"reference": "PESXA", "native": "PEXA", "pte": "EXA"}
    rows = []
    for rule_id, rule in RULES.items():
        for backend, covered in families.items():
            for scenario in SCENARIOS[rule.family]:
                nodeid = f"conformance/test_{rule.family}.py::test_{rule_id}[{backend}-{scenario}]"
                outcome, reason = KNOWN_BUGS.get((rule_id, backend, scenario), ("pass", ""))
                if rule.family not in covered:
                    outcome, reason = (
                        "not_applicable",
                        f"not applicable: {backend} has no {rule.family} rules",
                    )
                repro = f"pytest --ptn-backend={backend} '{nodeid}'"
                rows.append(
                    results.Result(
                        rule_id, rule.level, scenario, backend, outcome, reason, repro, None, nodeid
                    )
                )
    prov = {"pytest_ptn": "0.1.0", "torch": "2.13.0+cpu", "executorch": "1.5.1", "python": "3.11.7"}
    prov |= {"git_commit": "0123456789abcdef", "device": "cpu", "time": "2025-06-01T12:00:00+00:00"}
    return results.Results("1", prov, rows)


def test_the_browser_test_results_hold_every_rule(tmp_path: Path) -> None:
    """realistic_results() keeps up with the ruleset where no browser runs the test that reads it."""
    doc = realistic_results()
    assert {r.rule for r in doc.results} == set(RULES)
    assert render.write_reports(doc, tmp_path)[2].read_text().count("<tr") > len(RULES)


def test_html_renders_in_chromium(tmp_path: Path) -> None:
    """A person must be able to read the page; this at least proves a real browser renders it."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("chromium is not installed")
    index = render.write_reports(realistic_results(), tmp_path / "report")[2]
    png = tmp_path / "screenshot.png"
    flags = (
        "--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking"
    )
    flags += " --disable-component-update --disable-sync --window-size=1200,900"
    cmd = [
        browser,
        *flags.split(),
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={png}",
        index.as_uri(),
    ]
    subprocess.run(cmd, capture_output=True, timeout=60, check=False)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_intermittent_tests_are_counted_apart_with_what_they_did(tmp_path: Path) -> None:
    """A test an expectation lists as intermittent is neither a pass nor a known bug of the cell: every view
    counts it apart, with whether it passed or failed this time, and the run's verdict is not touched."""

    def row(nodeid: str, outcome: str, intermittent: bool) -> results.Result:
        reason = "known intermittent failure of racy on S7: threads race" if intermittent else ""
        return results.Result(
            "S7", "SHOULD", nodeid, "racy", outcome, reason, f"pytest {nodeid}", None, f"t.py::{nodeid}",
            intermittent=intermittent,
        )  # fmt: skip

    rows = [row("a", results.PASS, True), row("b", results.XFAIL, True), row("c", results.PASS, False)]
    doc = results.Results("1", {"torch": "2.13.0"}, rows)
    (s7,) = build_matrix(rows).rows
    assert (s7.cells["racy"].status, s7.cells["racy"].label) == (results.XFAIL, "1p 2i")
    assert s7.cells["racy"].words == "1 pass · 2 intermittent (1 passed, 1 failed)"
    text = "\n".join(render.render_text(doc))
    assert "2 intermittent tests (1 passed, 1 failed this time), listed as passing or failing by" in text
    assert "  i S7 on racy · a: passed this time" in text and "  i S7 on racy · b: failed this time" in text
    assert "SHOULD: all pass" in render.render_markdown(doc)
    render.write_reports(doc, tmp_path)
    summary = (tmp_path / "summary.md").read_text()
    assert "Intermittent: 2 intermittent tests (1 passed, 1 failed this time)" in summary
    assert "Expected failures (known bugs)" not in summary  # b failed as listed, apart from known bugs
    assert (
        "<h2>Intermittent: 2 intermittent tests (1 passed, 1 failed this time)</h2>"
        in (tmp_path / "index.html").read_text()
    )
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["intermittent"] == {"tests": 2, "passed": 1, "failed": 1}
    assert [r.intermittent for r in results.load(tmp_path / "results.json").results] == [True, True, False]
    written["results"][0]["outcome"] = results.FAIL  # an intermittent test only passes or fails as listed
    with pytest.raises(results.ResultsFormatError, match="an intermittent test passes or fails as expected"):
        results.from_dict(written)
