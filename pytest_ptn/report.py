"""The pytest side of the conformance report: collect per-rule outcomes, print the matrix, write the files.

Tests carry their metadata as ``item.user_properties`` (``ptn_rule`` once per rule checked, ``ptn_backend``,
and optionally ``ptn_scenario``, ``ptn_repro``, ``ptn_seed``). User properties travel inside every
TestReport, also from xdist workers, so the controller alone sees every outcome and nothing is merged by
hand. They also become ``<property>`` elements of each ``<testcase>`` in ``--junitxml`` output under every
``junit_family``; pass ``-o junit_family=xunit1`` (or ``legacy``) when the consumer validates against a
schema, since only the xunit1 schema allows properties inside a testcase.

A failed SHOULD test that the plugin turns into an xfail (so it does not fail the run) must carry a
``wasxfail`` starting with SHOULD_NOT_MET_PREFIX: it is reported as a failure of that SHOULD rule, with the
original assertion as reason, not as a known bug.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import pytest

from pytest_ptn import matrix
from pytest_ptn.ruleset import RULES, SPEC_VERSION

NOT_APPLICABLE_PREFIX = "not applicable"
SHOULD_NOT_MET_PREFIX = "SHOULD rule"
NO_BACKEND = "(no backend)"
_COLOURS = {
    matrix.FAIL: {"red": True, "bold": True},
    matrix.XFAIL: {"yellow": True},
    matrix.PASS: {"green": True},
}


def add_options(group: pytest.OptionGroup) -> None:
    group.addoption(
        "--ptn-report",
        metavar="DIR",
        default=None,
        help="write the conformance matrix to DIR: results.json (for merge/diff), summary.md "
        "(for $GITHUB_STEP_SUMMARY) and a self-contained index.html",
    )


def configure(config: pytest.Config) -> None:
    """Register on the controller only: workers' reports reach it through pytest_runtest_logreport."""
    if hasattr(config, "workerinput"):
        return
    config.pluginmanager.register(ConformanceReporter(config), "ptn-report")


@dataclass
class _Record:
    """What one test item amounts to after all of its phases."""

    nodeid: str
    properties: list[tuple[str, str]]
    outcome: str
    reason: str


class ConformanceReporter:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.records: dict[str, _Record] = {}
        self.written: list[Path] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        properties = [(str(name), str(value)) for name, value in report.user_properties]
        if not any(name == "ptn_rule" for name, _ in properties):
            return
        outcome = _outcome(report)
        if outcome is None:
            return
        previous = self.records.get(report.nodeid)
        if previous is not None and previous.outcome in (matrix.FAIL, matrix.XPASS):
            # The first failure is the cause; a later teardown error must not hide it.
            previous.properties = properties
            return
        self.records[report.nodeid] = _Record(report.nodeid, properties, outcome, _reason(report))

    def results(self, provenance: dict[str, str]) -> matrix.Results:
        rows = [row for record in self.records.values() for row in _rows(record)]
        return matrix.Results(SPEC_VERSION, provenance, matrix.sort_results(rows))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        outdir = self.config.getoption("ptn_report")
        if outdir is not None:
            self.written = matrix.write_reports(self.results(collect_provenance(self.config)), Path(outdir))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.records:
            return
        tw = self.config.get_terminal_writer()

        def paint(text: str, status: str) -> str:
            return tw.markup(text, **_COLOURS.get(status, {}))

        terminalreporter.write_sep("=", f"ptn conformance (spec v{SPEC_VERSION})")
        for line in matrix.render_text(self.results({}), paint):
            terminalreporter.write_line(line)
        if self.written:
            others = ", ".join(p.name for p in self.written[:-1])
            terminalreporter.write_line(f"ptn report: {self.written[-1].resolve()} (and {others})")


def _outcome(report: pytest.TestReport) -> str | None:
    """Map one phase's report to an outcome; None for phases that decide nothing (a passing setup)."""
    xfail = hasattr(report, "wasxfail")
    if report.failed or _should_not_met(report):
        strict_xpass = isinstance(report.longrepr, str) and report.longrepr.startswith("[XPASS(strict)]")
        return matrix.XPASS if strict_xpass else matrix.FAIL
    if report.skipped:
        if xfail:
            return matrix.XFAIL
        return matrix.NOT_APPLICABLE if _reason(report).startswith(NOT_APPLICABLE_PREFIX) else matrix.SKIP
    if report.when == "call":
        return matrix.XPASS if xfail else matrix.PASS
    return None


def _should_not_met(report: pytest.TestReport) -> bool:
    return report.skipped and getattr(report, "wasxfail", "").startswith(SHOULD_NOT_MET_PREFIX)


def _reason(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail") and not report.failed and not _should_not_met(report):
        return matrix.one_line(report.wasxfail) or "expected failure"
    longrepr = report.longrepr
    if isinstance(longrepr, tuple | list) and len(longrepr) == 3:  # a skip: (path, lineno, message)
        return matrix.one_line(str(longrepr[2]).removeprefix("Skipped: "))
    crash = getattr(longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(longrepr or "")
    prefix = "" if report.when == "call" else f"{report.when}: "
    return prefix + matrix.one_line(text)


def _rows(record: _Record) -> list[matrix.Result]:
    props: dict[str, str] = {}
    rules: list[str] = []
    for name, value in record.properties:
        if name == "ptn_rule":
            if value not in rules:
                rules.append(value)
        else:
            props[name] = value
    seed = props.get("ptn_seed")
    return [
        matrix.Result(
            rule=rule,
            level=RULES[rule].level if rule in RULES else "MUST",
            scenario=props.get("ptn_scenario"),
            backend=props.get("ptn_backend", NO_BACKEND),
            outcome=record.outcome,
            reason=record.reason,
            repro=props.get("ptn_repro", f"pytest '{record.nodeid}'"),
            seed=int(seed) if seed is not None and seed.lstrip("-").isdigit() else None,
            nodeid=record.nodeid,
        )
        for rule in rules
    ]


def collect_provenance(config: pytest.Config) -> dict[str, str]:
    """Where these results came from; versions read from package metadata so torch is never imported."""
    prov = {
        "pytest_ptn": _version("pytest-ptn"),
        "torch": _version("torch"),
        "executorch": _version("executorch"),
        "python": platform.python_version(),
    }
    commit = _first_line(["git", "rev-parse", "HEAD"], config.invocation_params.dir)
    if commit:
        prov["git_commit"] = commit
    gpu = (
        _first_line(["nvidia-smi", "-L"], config.invocation_params.dir)
        if shutil.which("nvidia-smi")
        else None
    )
    prov["device"] = gpu or "cpu"
    prov["platform"] = platform.platform()
    prov["time"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return prov


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def _first_line(cmd: list[str], cwd: Path) -> str | None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = proc.stdout.strip().splitlines()
    return lines[0].strip() if proc.returncode == 0 and lines else None
