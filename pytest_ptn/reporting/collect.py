"""The pytest side of the conformance report: collect per-rule outcomes, print the matrix, write the files.

Tests carry their metadata as ``item.user_properties`` (``ptn_rule`` once per rule checked, ``ptn_backend``,
and optionally ``ptn_scenario``, ``ptn_repro``, ``ptn_seed``, ``ptn_intermittent``). User properties travel
inside every TestReport, also from xdist workers, so the controller alone sees every outcome and nothing is
merged by hand. They also become ``<property>`` elements of each ``<testcase>`` in ``--junitxml`` output
under every ``junit_family``; pass ``-o junit_family=xunit1`` (or ``legacy``) when the consumer validates
against a schema, since only the xunit1 schema allows properties inside a testcase.

A failed SHOULD test that the plugin turns into an xfail (so it does not fail the run) carries the outcome
``fail`` as a property (``run.not_applicable.OUTCOME_PROPERTY``): it is reported as a failure of that SHOULD
rule, with the original assertion as reason, not as a known bug. A test that ended as not applicable
(``run.not_applicable.skip_not_applicable``) carries ``not_applicable`` the same way: outcomes are read from
that property, never from a reason's words.

A test an intermittent expectation lists is a non-strict xfail: it is reported as what it did this time,
a pass (pytest's XPASS) or an expected failure, marked intermittent (``results.Result.intermittent``).

A failed report without ``ptn_rule`` (an internal error, a crash report without the test's properties, a
collection error) is still a failure of the run: it is reported under rule ``results.UNKNOWN_RULE``, so a
summary never reads "all pass" over a test that did not pass.

A run that stops before its selection finished (a signal, ``-x``/``--maxfail``, a worker pool that gave up)
is marked incomplete in every report (`results.RunStatus`): how many of the selected tests finished and why
it stopped, and its exit status is never 0. With ``--ptn-report`` each test's rows also reach
``DIR/verdicts.jsonl`` as the test finishes (`stream`), so even a killed run leaves them.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from pytest_ptn import mechanisms
from pytest_ptn.backend import OWNED_PROPERTY, WHOSE_PROPERTY
from pytest_ptn.fuzzing.tally import TALLY_PROPERTY, FuzzTally
from pytest_ptn.reporting import render, results, stream
from pytest_ptn.reporting.held import held_shares, nothing_held
from pytest_ptn.ruleset import (
    MUST,
    RULES,
    SPEC_VERSION,
    is_strict_xpass,
)
from pytest_ptn.run import stopping
from pytest_ptn.run.not_applicable import OUTCOME_PROPERTY
from pytest_ptn.scheduling import shards

NO_BACKEND = "(no backend)"
INTERMITTENT_PROPERTY = "ptn_intermittent"
"""The user property of a test an intermittent expectation lists (value "1"), set at collection."""
_COLOURS = {
    results.FAIL: {"red": True, "bold": True},
    results.XFAIL: {"yellow": True},
    results.PASS: {"green": True},
}


def add_options(group: pytest.OptionGroup) -> None:
    group.addoption(
        "--ptn-report",
        metavar="DIR",
        default=None,
        help="write the conformance matrix to DIR: results.json (for merge/diff), summary.md "
        "(for $GITHUB_STEP_SUMMARY) and a self-contained index.html; and each test's runtime output to "
        "DIR/runtime-logs/",
    )


def configure(config: pytest.Config) -> None:
    """Register on the controller only: workers' reports reach it through pytest_runtest_logreport."""
    if hasattr(config, "workerinput"):
        return
    outdir = config.getoption("ptn_report")
    reporter = ConformanceReporter(config, None if outdir is None else writable_folder(outdir))
    reporter.claim()
    config.pluginmanager.register(reporter, "ptn-report")


def writable_folder(value: str) -> Path:
    """The ``--ptn-report`` folder, created and proven writable now: found only when the run ends, a bad
    one cost the whole run's report."""
    path = Path(value).resolve()
    if path.exists() and not path.is_dir():
        raise pytest.UsageError(f"--ptn-report {value}: is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise pytest.UsageError(f"--ptn-report {value}: cannot write there: {exc.strerror or exc}") from exc
    return path


def repro_command(item: pytest.Item, backend: str, suite_package: str, suite: Path | None) -> str:
    """A command that reruns exactly this test: for the installed suite (package ``suite_package`` in
    folder ``suite``) by module name and node id, so it works from any folder; else by node id relative to
    the folder pytest was started from."""
    test = item.nodeid.split("::", 1)[1]
    if suite is not None and item.path.is_relative_to(suite):
        module = ".".join((suite_package, *item.path.relative_to(suite).with_suffix("").parts))
        target = f"--pyargs {shlex.quote(f'{module}::{test}')}"
    else:
        path = os.path.relpath(item.path, item.config.invocation_params.dir)
        target = shlex.quote(f"{Path(path).as_posix()}::{test}")
    return f"pytest {target} --ptn-backend={shlex.quote(backend)}"


@dataclass
class _Record:
    """What one test item amounts to after all of its phases."""

    nodeid: str
    properties: list[tuple[str, str]]
    outcome: str
    reason: str


class ConformanceReporter:
    def __init__(self, config: pytest.Config, outdir: Path | None) -> None:
        self.config = config
        self.outdir = outdir
        self.records: dict[str, _Record] = {}
        self.finished: set[str] = set()
        self.collect_errors: set[str] = set()
        self.crashed: set[str] = set()
        self.workers_lost = 0
        self.written: list[Path] = []
        self.provenance: dict[str, str] = {}
        self.stream: stream.VerdictStream | None = None
        self.selection_streamed = False
        self.stopped: str | None = None
        self.testing = False
        self.run: results.RunStatus | None = None
        self.report_error: OSError | None = None
        """Why the report could not be written (its stream, or its files at the end), if so."""
        self.claimed: int | None = None
        """The stream's file, locked for this run from the start (``stream.claim``)."""

    def claim(self) -> None:
        """The folder is this run's until it ends; one another run still writes is a usage error naming it
        (an error opening it is the stream's, told when the run ends)."""
        if self.outdir is None:
            return
        try:
            self.claimed = stream.claim(self.outdir / stream.NAME)
        except stream.InUse as e:
            raise pytest.UsageError(
                f"--ptn-report {self.outdir}: {e}; give each run a folder of its own"
            ) from None
        except OSError:
            pass

    def pytest_unconfigure(self) -> None:
        """A run that ended before its session (a usage error) lets the folder go too."""
        if self.stream is not None:
            self.stream.close()
        elif self.claimed is not None:
            os.close(self.claimed)
        self.claimed = None

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Reports of an earlier run in DIR go now: a run killed later must not leave them looking like its
        own. Provenance is taken once, at the start, for the stream's header and the final report."""
        if self.outdir is None:
            return
        for name in render.REPORT_FILES:
            (self.outdir / name).unlink(missing_ok=True)
        self.provenance = collect_provenance(self.config)
        self.stream = stream.VerdictStream(
            self.outdir / stream.NAME, SPEC_VERSION, self.provenance, self._shard(), self.claimed
        )

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.stream is not None:
            self.stream.selected(len(session.items))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """Under xdist the workers collect (each the same selection); the controller learns it here."""
        if self.stream is not None and not self.selection_streamed:
            self.selection_streamed = True
            self.stream.selected(len(ids))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        """Tests are meant to run (not so under --collect-only, or pytest --fixtures, which never loops)."""
        self.testing = not self.config.option.collectonly

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report, [(str(name), str(value)) for name, value in report.user_properties])
        if report.when != "teardown" and report.nodeid not in self.crashed:
            return
        self.finished.add(report.nodeid)  # its last report: the teardown, or the crash of its worker
        record = self.records.get(report.nodeid)
        if self.stream is not None and record is not None:
            self.stream.test(report.nodeid, _rows(record, self._backends()))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:  # a module of tests that never ran
            self._record(report, [])
            self.collect_errors.add(report.nodeid)
            if self.stream is not None:
                self.stream.test(report.nodeid, _rows(self.records[report.nodeid], self._backends()))

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        self.crashed.add(crashitem)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        self.workers_lost += error is not None

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        self.stopped = stopping.reason(excinfo.value)

    def _shard(self) -> str | None:
        shard = self.config.stash.get(shards.SHARD, None)
        return None if shard is None else str(shard)

    def _backends(self) -> set[str]:
        return {value for r in self.records.values() for name, value in r.properties if name == "ptn_backend"}

    def _record(
        self, report: pytest.TestReport | pytest.CollectReport, properties: list[tuple[str, str]]
    ) -> None:
        if not any(name == "ptn_rule" for name, _ in properties):
            if not report.failed:
                return
            properties = [*properties, ("ptn_rule", results.UNKNOWN_RULE)]
        outcome = _outcome(report)
        if outcome is None:
            return
        if outcome == results.XPASS and report.passed and (INTERMITTENT_PROPERTY, "1") in properties:
            outcome = results.PASS  # a non-strict xfail that passed: one of the outcomes it may have
        previous = self.records.get(report.nodeid)
        if previous is not None and previous.outcome in (results.FAIL, results.XPASS):
            # The first failure is the cause; a later teardown error must not hide it.
            previous.properties = properties
            return
        self.records[report.nodeid] = _Record(report.nodeid, properties, outcome, _reason(report))

    def run_status(self, session: pytest.Session) -> results.RunStatus:
        """How much of the selection finished, and why the run stopped if it did not finish."""
        selected = session.testscollected
        stopped = self.stopped or session.shouldfail or session.shouldstop or None
        if stopped is None and self.testing and len(self.finished) < selected:
            plural = "s" if self.workers_lost > 1 else ""
            lost = f" after {self.workers_lost} xdist worker{plural} crashed" if self.workers_lost else ""
            stopped = f"the run ended early{lost}"
        return results.RunStatus(
            selected, len(self.finished), None if stopped is None else str(stopped), self._shard()
        )

    def document(self, provenance: dict[str, str]) -> results.Results:
        """What the finished tests found: a test a stopped run left half done has no verdict yet."""
        backends = self._backends()
        done = [
            r for r in self.records.values() if r.nodeid in self.finished or r.nodeid in self.collect_errors
        ]
        rows = [row for record in done for row in _rows(record, backends)]
        return results.Results(SPEC_VERSION, provenance, results.sort_results(rows), run=self.run)

    @pytest.hookimpl(tryfirst=True)  # before xdist waits for its workers to go: a stopped run reports now
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.run = self.run_status(session)
        if not self.run.complete and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.INTERRUPTED
        if self.outdir is not None:
            try:
                self.written = render.write_reports(self.document(self.provenance), self.outdir)
            except OSError as e:  # a full disk: the run's exit status stays its tests'
                self.report_error = e
        if self.stream is not None:
            self.stream.end(self.run)
            if not self.written:  # the files hold the whole report when they could be written
                self.report_error = self.report_error or self.stream.error

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """Shown for runs with conformance tests (or a report asked for): a run of other tests in a
        repository that has pytest-ptn installed gets no matrix of their failures."""
        conformance = any(
            (name, value) != ("ptn_rule", results.UNKNOWN_RULE)
            for r in self.records.values()
            for name, value in r.properties
            if name == "ptn_rule"
        )
        stopped = self.run is not None and not self.run.complete
        if not (self.records or stopped) or not (conformance or self.outdir):
            return
        tw = self.config.get_terminal_writer()

        def paint(text: str, status: str) -> str:
            return tw.markup(text, **_COLOURS.get(status, {}))

        terminalreporter.write_sep("=", f"ptn conformance (spec v{SPEC_VERSION})")
        doc = self.document({})
        for line in render.render_text(doc, paint, pytest_showed=True):
            terminalreporter.write_line(line)
        if self.report_error is not None:
            e = self.report_error
            why = f"[Errno {e.errno}] {e.strerror}" if e.errno is not None else str(e)
            terminalreporter.write_line(
                f"ptn report: INCOMPLETE: cannot write in {self.outdir}: {why}; nothing half-written is left",
                red=True,
            )
        elif self.written:
            others = ", ".join(p.name for p in self.written[:-1])
            terminalreporter.write_line(f"ptn report: {self.written[-1].resolve()} (and {others})")
        for line in nothing_held(held_shares(doc.results)):
            terminalreporter.write_line(f"ptn: {line}", yellow=True)


def _outcome(report: pytest.TestReport | pytest.CollectReport) -> str | None:
    """Map one phase's report to an outcome; None for phases that decide nothing (a passing setup)."""
    xfail = hasattr(report, "wasxfail")
    if report.failed or _should_not_met(report):
        return results.XPASS if is_strict_xpass(report.longrepr) else results.FAIL
    if report.skipped:
        if xfail:
            return results.XFAIL
        marked = _marked(report)
        return marked if marked in (results.NOT_APPLICABLE, results.NOT_EXERCISED) else results.SKIP
    if report.when == "call":
        return results.XPASS if xfail else results.PASS
    return None


def _should_not_met(report: pytest.TestReport | pytest.CollectReport) -> bool:
    """A failed SHOULD test, an xfail to pytest (the plugin marks it, pytest_runtest_makereport)."""
    return report.skipped and hasattr(report, "wasxfail") and _marked(report) == results.FAIL


def _marked(report: pytest.TestReport | pytest.CollectReport) -> str | None:
    """The outcome the plugin gave the test where pytest's own does not tell it (OUTCOME_PROPERTY)."""
    properties = getattr(report, "user_properties", ())
    return next((value for name, value in properties if name == OUTCOME_PROPERTY), None)


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The whole message (capped): a failure's finding is often every line of it, not the first."""
    if hasattr(report, "wasxfail") and not report.failed and not _should_not_met(report):
        return results.whole_reason(report.wasxfail) or "expected failure"
    longrepr = report.longrepr
    if isinstance(longrepr, tuple | list) and len(longrepr) == 3:  # a skip: (path, lineno, message)
        return results.whole_reason(str(longrepr[2]).removeprefix("Skipped: "))
    crash = getattr(longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(longrepr or "")
    prefix = "" if report.when == "call" else f"{report.when}: "
    return prefix + results.whole_reason(text)


def _backend_in(nodeid: str, backends: set[str]) -> str:
    """The backend a test id names among its parameters (``test_x[pte-kv_cache]``), else NO_BACKEND."""
    name = nodeid.rsplit("::", 1)[-1]
    params = f"-{name[name.index('[') + 1 : -1]}-" if "[" in name and name.endswith("]") else ""
    return next((b for b in sorted(backends, key=len, reverse=True) if f"-{b}-" in params), NO_BACKEND)


def _owned(value: str | None) -> tuple[int, int] | None:
    """OWNED_PROPERTY's ``[held, checked]``, as the plugin wrote it."""
    if value is None:
        return None
    held, checked = json.loads(value)
    return int(held), int(checked)


def _rows(record: _Record, backends: set[str]) -> list[results.Result]:
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
        results.Result(
            rule=rule,
            level=RULES[rule].level if rule in RULES else MUST,
            scenario=props.get("ptn_scenario"),
            backend=props.get("ptn_backend") or _backend_in(record.nodeid, backends),
            outcome=record.outcome,
            reason=record.reason,
            repro=props.get("ptn_repro", f"pytest '{record.nodeid}'"),
            seed=int(seed) if seed is not None and seed.lstrip("-").isdigit() else None,
            nodeid=record.nodeid,
            schedule=props.get("ptn_schedule"),
            intermittent=props.get(INTERMITTENT_PROPERTY) == "1"
            and record.outcome in results.INTERMITTENT_OUTCOMES,
            fuzz=FuzzTally.from_data(json.loads(props[TALLY_PROPERTY])) if TALLY_PROPERTY in props else None,
            mechanisms=mechanisms.from_data(json.loads(props[mechanisms.PROPERTY]))
            if mechanisms.PROPERTY in props
            else (),
            whose=props.get(WHOSE_PROPERTY),
            owned=_owned(props.get(OWNED_PROPERTY)),
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
