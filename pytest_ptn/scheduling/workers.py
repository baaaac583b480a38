"""pytest-xdist: the controller's seed for every worker, each case's tests on one worker, and a dead worker
failing only the test it ran."""

from __future__ import annotations

import functools
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from pytest_ptn.ruleset import WAITS_FOR_CLOCK
from pytest_ptn.run.failure import Found, carried
from pytest_ptn.run.state import RunState
from pytest_ptn.scheduling import crashes, hangs

USAGE_ERROR = "usage-error.txt"
"""In the run folder: the usage error a worker found (a requested backend that cannot run, as it loaded its
runtime; an expectation entry that matches no test)."""

CRASH_RESTARTS = 1000
"""Worker restarts a run allows when ``--max-worker-restart`` is not given: a crashed step is not retried, so
this bounds only backends that crash in ever new places."""


class Xdist:
    """pytest-xdist hooks: the controller's seed for every worker, each case's tests on one worker, and a
    worker that dies failing the test it ran (pytest_ptn.scheduling.crashes) while the run goes on."""

    def __init__(self, state: RunState, config: pytest.Config):
        self.state = state
        self.config = config
        self.collected: set[str] = set()

    @functools.cached_property
    def run_folder(self) -> Path:
        """The folder the controller shares with its workers, made when the first worker is configured (an
        in-process run makes none)."""
        workerinput = getattr(self.config, "workerinput", None)
        if workerinput is not None:
            return Path(workerinput["ptn_run_folder"])
        return Path(tempfile.mkdtemp(prefix="ptn-run-"))

    def by_case(self, config: pytest.Config) -> bool:
        """Whether this run is scheduled by case: ``--dist load`` (what ``-n`` means by default) or
        ``loadscope`` on the conformance suite. Other ``--dist`` modes, and runs that request no backend (no
        suite), are xdist's own."""
        return config.getvalue("dist") in ("load", "loadscope") and self.state.explicit

    def pytest_configure_node(self, node: Any) -> None:
        """Workers fuzz (and collect) alike, order their collection for the scheduler and share the run
        folder."""
        node.workerinput["ptn_seed"] = self.state.seed
        node.workerinput["ptn_by_case"] = self.by_case(node.config)
        node.workerinput["ptn_run_folder"] = str(self.run_folder)
        node.workerinput["ptn_sys_path"] = list(sys.path)

    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """A worker has collected; one that found a usage error (a requested backend cannot run here) ends
        the run with it, before any test is scheduled."""
        self.collected.add(node.gateway.id)
        try:
            error = (self.run_folder / USAGE_ERROR).read_text()
        except OSError:
            return
        pytest.exit(error, returncode=pytest.ExitCode.USAGE_ERROR)

    def pytest_testnodedown(self, node: Any, error: object | None) -> None:
        """A worker that dies before it has collected would die again in its replacement: end the run, as a
        usage error naming the call where it died in a call into the backend. A worker that died takes
        what is left of its process group with it (one that finished is still exiting: it ends its own)."""
        if error is not None:
            crashes.end_group(node)
        if error is not None and self.state.explicit and node.gateway.id not in self.collected:
            self.refuse_backend(node, "before its first test")
            pytest.exit(
                f"ptn: xdist worker {node.gateway.id} died before collecting the tests ({error}); its own "
                "output is above. Run in-process with -n 0 to see the error where it happens.",
                returncode=pytest.ExitCode.INTERNAL_ERROR,
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """``--dist load``, except that the tests of one (backend, scenario) are one unit of work: lowering
        is the slow step and is cached per worker, so spreading a scenario's tests over the workers lowered
        it once on each. Units go out in collection order, where workers put the tests outside any case
        first (pytest_collection_modifyitems): the fuzz test, by far the longest, then runs beside the cases
        instead of after them. A crashed test is done (its failure is reported), not run again on the next
        worker; and a worker that is still starting gets work once it has collected."""
        if not self.by_case(config):
            return None
        from xdist.scheduler import LoadScopeScheduling

        backends = sorted(self.state.requested, key=len, reverse=True)
        scenarios = self.state.scenario_names()
        by_module = config.getvalue("dist") == "loadscope"

        run_folder = self.run_folder

        class CaseScheduling(LoadScopeScheduling):
            @functools.cached_property
            def clock_tests(self) -> set[str]:
                """With one worker (a run without -n), the tests that wait for the clock, else none: with
                several, a later unit could go to a worker that has not lowered the case yet."""
                if self.numnodes > 1:
                    return set()
                return tests_waiting_for_clock(crashes.all_properties(run_folder))

            def _split_scope(self, nodeid: str) -> str:
                case = case_of(nodeid, backends, scenarios)
                if case is not None:
                    return later_unit(case) if nodeid in self.clock_tests else case
                return super()._split_scope(nodeid) if by_module else nodeid

            def remove_node(self, node: Any) -> str | None:
                workload = self.assigned_work.pop(node)
                crashed = next(
                    (nodeid for unit in workload.values() for nodeid, done in unit.items() if not done), None
                )
                if crashed is None:
                    return None
                for unit in workload.values():
                    if crashed in unit:
                        unit[crashed] = True
                pending = {scope: unit for scope, unit in workload.items() if not all(unit.values())}
                self.workqueue.update(pending)
                for other in self.assigned_work:
                    self._reschedule(other)
                return crashed

            def _reschedule(self, node: Any) -> None:
                if node not in self.registered_collections:  # a replacement worker has not collected yet
                    return
                super()._reschedule(node)
                # A worker runs a test once it holds the next one (or is told to stop): a replacement
                # worker given one unit of one test would wait for ever.
                while (
                    self.workqueue
                    and not node.shutting_down
                    and self._pending_of(self.assigned_work[node]) < 2
                ):
                    self._assign_work_unit(node)

        config.option.loadscopereorder = False  # largest unit first would put every single test last
        return CaseScheduling(config, log)

    def refuse_backend(self, worker: Any, nodeid: str) -> None:
        """End the run as a usage error if ``worker`` died (crashed, or hung past the limit) in a call into
        the backend outside any case (its ``__init__``, ``availability()``, ``load_runtime()``): no test of
        it can run."""
        worker_id = getattr(getattr(worker, "gateway", None), "id", "?")
        step = crashes.last_step(self.run_folder, worker_id)
        if step is None or not step.backend_call:
            return
        text = crashes.crash_report(
            self.run_folder,
            worker_id,
            crashes.worker_returncode(worker),
            nodeid,
            None,
            {},
            hangs.limit(self.config),
        ).text
        pytest.exit(
            f"--ptn-backend={step.backend} cannot run: its worker {text}",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )

    @pytest.hookimpl(tryfirst=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """The test a dead worker was running fails with the signal (or, for a worker the watchdog ended,
        the hang), the step, the backend's versions and its properties (so it is in the matrix and the
        reports), never as a bare "worker crashed". A crash or hang an expectation lists is that expected
        failure, as the worker's strict xfail would have made it (one that passes instead fails there as
        stale)."""
        self.refuse_backend(getattr(report, "node", None), crashitem)
        properties = crashes.read_properties(self.run_folder, crashitem)
        found = dict(properties)
        spec = found.get("ptn_backend", "")
        availability = self.state.availability.get(spec)
        worker = getattr(report, "node", None)
        worker_id = getattr(getattr(worker, "gateway", None), "id", "?")
        report.when = "call"
        death = crashes.crash_report(
            self.run_folder,
            worker_id,
            crashes.worker_returncode(worker),
            crashitem,
            found.get("ptn_repro"),
            availability.versions if availability is not None else {},
            hangs.limit(self.config),
        )
        report.user_properties = carried(properties, Found((death.mechanism,)))
        report.longrepr = death.text
        rules = [value for key, value in properties if key == "ptn_rule"]
        scenario, schedule = found.get("ptn_scenario"), found.get("ptn_schedule")
        expected = self.state.expected(spec, rules, scenario, schedule) if availability is not None else []
        if expected and not self.config.option.runxfail:
            listed = next((e for e in expected if e.intermittent), expected[0])  # as plugin.mark_expected
            report.outcome = "skipped"
            report.wasxfail = f"{listed.describe()}\n{death.text}"

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if not hasattr(config, "workerinput") and "run_folder" in self.__dict__:  # the controller made it
            shutil.rmtree(self.run_folder, ignore_errors=True)


class CrashIsolatedWorker:
    """A worker's side of crash isolation: faulthandler and last words into the run folder, the time limit
    of each step, and each test's properties for the controller."""

    def __init__(self, config: pytest.Config):
        self.folder = Path(config.workerinput["ptn_run_folder"])  # type: ignore[attr-defined]
        self.worker_id = str(config.workerinput["workerid"])  # type: ignore[attr-defined]
        self.limit = hangs.limit(config)
        crashes.start_worker(self.folder, self.worker_id, self.limit)  # before the backend's availability()

    @pytest.hookimpl(tryfirst=True)  # before xdist tells the controller, which schedules from them
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        crashes.write_properties(
            self.folder,
            {
                item.nodeid: [(name, str(value)) for name, value in item.user_properties]
                for item in session.items
            },
        )

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        crashes.note_test(nodeid)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        crashes.note_test_done()

    def pytest_unconfigure(self) -> None:
        crashes.stop_worker()


def is_controller(config: pytest.Config) -> bool:
    """Whether this process hands the run's tests to xdist workers (and runs none itself)."""
    return not hasattr(config, "workerinput") and bool(config.getoption("numprocesses", None))


def note_usage_error(config: pytest.Config, message: str) -> None:
    """In a worker: a usage error, for the controller to end the run with once the worker has collected."""
    (Path(config.workerinput["ptn_run_folder"]) / USAGE_ERROR).write_text(message)  # type: ignore[attr-defined]


def one_worker_by_default(early_config: pytest.Config) -> None:
    """A conformance run without ``-n`` gets one xdist worker (see plugin.pytest_load_initial_conftests).

    Decided from the command line as parsed so far (``known_args_namespace``, what plugins read before the
    full parse) and written there and into ``config.option``, which the full parse keeps as the default of
    options not given: every plugin then sees the run as distributed, as if ``-n 1`` had been typed. A
    worker, whose command line is the controller's, decides alike: xdist unsets ``-n`` there afterwards, as
    it does a typed one."""
    if not early_config.pluginmanager.hasplugin("xdist"):
        return
    known = early_config.known_args_namespace
    explicit = bool(known.ptn_backends or early_config.getini("ptn_backends"))
    if not explicit or known.numprocesses is not None or known.usepdb or known.collectonly or known.help:
        return
    for namespace in (known, early_config.option):
        namespace.numprocesses = 1
        if namespace.maxworkerrestart is None:  # one restart per crashed step; xdist's default stops at 4
            namespace.maxworkerrestart = str(CRASH_RESTARTS)


def tests_waiting_for_clock(properties: dict[str, list[tuple[str, str]]]) -> set[str]:
    """The tests that check a rule waiting for the zip clock, by the rules their workers recorded."""
    return {
        nodeid
        for nodeid, pairs in properties.items()
        if any(k == "ptn_rule" and v in WAITS_FOR_CLOCK for k, v in pairs)
    }


def later_unit(case: str) -> str:
    """One unit per backend for the tests that wait for the clock, queued after every case (workers put
    them last): by then the one worker's packages they compare with are seconds old, so nothing waits."""
    return f"{case.split('::', 1)[0]}::after-every-case"


def case_of(nodeid: str, backends: list[str], scenarios: list[str]) -> str | None:
    """``backend::scenario`` for a test parametrized with both (its id holds ``backend-scenario``), else
    None. The controller sees test ids only: pytest joins the ids of the parameters with ``-`` in the order
    they were parametrized, backend then scenario."""
    name = nodeid.rsplit("::", 1)[-1]
    if "[" not in name or not name.endswith("]"):
        return None
    params = f"-{name[name.index('[') + 1 : -1]}-"
    for backend in backends:
        for scenario in scenarios:
            if f"-{backend}-{scenario}-" in params:
                return f"{backend}::{scenario}"
    return None
