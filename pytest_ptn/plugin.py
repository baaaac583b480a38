"""The pytest plugin: ``--ptn-backend``, rule markers, backend x scenario parametrization, the header.

Loading it imports neither torch nor executorch (backends import them when they lower or load), so a
repository that has pytest-ptn installed pays nothing in runs that do not use it.
"""

from __future__ import annotations

import importlib.util
import random
import shutil
import sys
import tempfile
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _pytest.reports import TestReport

from pytest_ptn import catalogue, crashes, expectations, report, upstream_noise
from pytest_ptn.backend import Availability, Backend, BackendError, availability_of, resolve_backend
from pytest_ptn.ruleset import RULE_NEEDS, RULES, SPEC_VERSION

if TYPE_CHECKING:
    from pytest_ptn.harness import Case
    from pytest_ptn.spec import Scenario

DEFAULT_BACKEND = "reference"
CRASH_RESTARTS = 1000
"""Worker restarts a run allows when ``--max-worker-restart`` is not given: a crashed step is not retried, so
this bounds only backends that crash in ever new places."""
SUITE_PACKAGE = "pytest_ptn.conformance"


@dataclass
class Session:
    """Plugin state for one pytest run (kept on ``config.stash``)."""

    requested: list[str]
    explicit: bool
    seed: int
    classes: dict[str, type[Backend]] = field(default_factory=dict)
    availability: dict[str, Availability] = field(default_factory=dict)
    instances: dict[str, Backend] = field(default_factory=dict)
    expectation_files: list[expectations.ExpectationFile] = field(default_factory=list)
    lowered: dict[tuple[int, str], object] = field(default_factory=dict)
    inspected: dict[str, dict] = field(default_factory=dict)

    def expected(self, spec: str, rules: list[str], scenario: str | None) -> list[expectations.Expectation]:
        cls, versions = self.classes[spec], self.availability[spec].versions
        return [
            e
            for f in self.expectation_files
            if f.applies_to(cls.name, versions)
            for e in f.entries
            if e.matches(cls.name, rules, scenario)
        ]

    def backend(self, spec: str) -> Backend:
        if spec not in self.instances:
            self.instances[spec] = self.classes[spec]()
        return self.instances[spec]


SESSION = pytest.StashKey[Session]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ptn", "pytest-ptn: ExecuTorch backend conformance")
    group.addoption(
        "--ptn-backend",
        action="append",
        dest="ptn_backends",
        metavar="NAME",
        help="backend to run the conformance suite on: an installed name (reference, native, ...) or "
        "module:Class; repeatable. Giving one also collects the installed suite when no paths are given.",
    )
    parser.addini("ptn_backends", type="linelist", help="backends to run when --ptn-backend is not given")
    group.addoption(
        "--ptn-expectations",
        action="append",
        metavar="PATH",
        help="files of known backend failures, used instead of the ones shipped with the suite",
    )
    group.addoption(
        "--ptn-no-expectations",
        action="store_true",
        help="ignore known-failure expectations: every backend failure fails the run",
    )
    group.addoption(
        "--ptn-fuzz-profile",
        default="ptn-ci",
        choices=("ptn-ci", "ptn-nightly"),
        help="hypothesis profile of the fuzz tests: ptn-ci (few examples, derandomized, no database, a "
        "failure not shrunk) or ptn-nightly (many examples, random, example database in .hypothesis/ptn, a "
        "failure shrunk to a small program)",
    )
    group.addoption("--ptn-seed", type=int, help="seed of the nightly fuzz profile (printed in the header)")
    group.addoption(
        upstream_noise.SHOW_OPTION,
        action="store_true",
        dest="ptn_upstream_logs",
        help="let the warnings and DEBUG/INFO logs of torch, executorch and torchao through to pytest while "
        "backends work, under this repository's own filters and log levels (by default warnings are counted "
        "and summarized at the end, never raised, and those logs are not captured)",
    )
    report.add_options(group)


def pytest_configure(config: pytest.Config) -> None:
    for rule in RULES.values():
        config.addinivalue_line(
            "markers", f"{rule.id}: conformance rule {rule.id} ({rule.level}): {rule.title}"
        )
    config.addinivalue_line(
        "markers", "ptn_scenarios(tag): run this conformance test on every catalogue scenario with this tag"
    )
    cli = config.getoption("ptn_backends") or []
    ini = config.getini("ptn_backends")
    requested = list(dict.fromkeys(cli or ini or [DEFAULT_BACKEND]))
    workerinput = getattr(config, "workerinput", None)
    seed = config.getoption("ptn_seed")
    if seed is None:  # one seed for the run: xdist workers get the controller's (pytest_configure_node)
        seed = workerinput["ptn_seed"] if workerinput else random.randrange(2**32)
    state = Session(requested, explicit=bool(cli or ini), seed=seed)
    config.stash[SESSION] = state
    if config.getoption("help", False):
        return
    if workerinput and "ptn_sys_path" in workerinput:  # backends the controller could import, workers can
        sys.path[:0] = [p for p in workerinput["ptn_sys_path"] if p not in sys.path]
    report.configure(config)
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(Xdist(state, config), "ptn-xdist")
        if hasattr(config, "workerinput") and state.explicit:
            config.pluginmanager.register(CrashIsolatedWorker(config), "ptn-crash-worker")
    for spec in requested:
        try:
            cls = resolve_backend(spec)
            state.availability[spec] = availability_of(spec, cls)
        except BackendError as e:
            raise pytest.UsageError(f"--ptn-backend: {e}") from e
        state.classes[spec] = cls
        if state.explicit and not state.availability[spec].available:
            raise pytest.UsageError(
                f"--ptn-backend={spec} is unavailable on this machine: {state.availability[spec].reason}"
            )
    suite = suite_path()
    if not config.getoption("ptn_no_expectations"):
        given = config.getoption("ptn_expectations")
        paths = [Path(p) for p in given] if given else expectations.shipped(suite)
        try:
            state.expectation_files = [expectations.read(p) for p in paths]
        except expectations.ExpectationsError as e:
            raise pytest.UsageError(f"--ptn-expectations: {e}") from e
    from_args = config.args_source == pytest.Config.ArgsSource.ARGS
    if state.explicit and not from_args and suite is not None and str(suite) not in config.args:
        config.args.append(str(suite))


class Xdist:
    """pytest-xdist hooks: the controller's seed for every worker, each case's tests on one worker, and a
    worker that dies failing the test it ran (pytest_ptn.crashes) while the run goes on."""

    def __init__(self, state: Session, config: pytest.Config):
        self.state = state
        self.collected: set[str] = set()
        workerinput = getattr(config, "workerinput", None)
        if workerinput is not None:
            self.run_folder = Path(workerinput["ptn_run_folder"])
        else:
            self.run_folder = Path(tempfile.mkdtemp(prefix="ptn-run-"))

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
        self.collected.add(node.gateway.id)

    def pytest_testnodedown(self, node: Any, error: object | None) -> None:
        """A worker that dies before it has collected would die again in its replacement: end the run."""
        if error is not None and self.state.explicit and node.gateway.id not in self.collected:
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
        scenarios = [s.name for s in catalogue.SCENARIOS]
        by_module = config.getvalue("dist") == "loadscope"

        class CaseScheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                case = case_of(nodeid, backends, scenarios)
                if case is not None:
                    return case
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
                if node in self.registered_collections:  # a replacement worker has not collected yet
                    super()._reschedule(node)

        config.option.loadscopereorder = False  # largest unit first would put every single test last
        return CaseScheduling(config, log)

    @pytest.hookimpl(tryfirst=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """The test a dead worker was running fails with the signal, the step and its properties (so it is
        in the matrix and the reports), never as a bare "worker crashed"."""
        properties = crashes.read_properties(self.run_folder, crashitem)
        repro = dict(properties).get("ptn_repro")
        worker = getattr(report, "node", None)
        worker_id = getattr(getattr(worker, "gateway", None), "id", "?")
        report.user_properties = list(properties)
        report.when = "call"
        report.longrepr = crashes.crash_report(
            self.run_folder, worker_id, crashes.worker_returncode(worker), crashitem, repro
        )

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if not hasattr(config, "workerinput"):
            shutil.rmtree(self.run_folder, ignore_errors=True)


class CrashIsolatedWorker:
    """A worker's side of crash isolation: faulthandler and last words into the run folder, and each test's
    properties for the controller."""

    def __init__(self, config: pytest.Config):
        self.folder = Path(config.workerinput["ptn_run_folder"])  # type: ignore[attr-defined]
        self.worker_id = str(config.workerinput["workerid"])  # type: ignore[attr-defined]

    def pytest_sessionstart(self) -> None:
        crashes.start_worker(self.folder, self.worker_id)

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

    def pytest_unconfigure(self) -> None:
        crashes.stop_worker()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """A conformance run without ``-n`` goes to one xdist worker, so a backend that kills its process fails
    the test it was running instead of ending the run. ``-n 0`` (or ``-p no:xdist``, ``--pdb``) runs in
    process."""
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist"):
        return
    option = config.option
    explicit = bool(config.getoption("ptn_backends") or config.getini("ptn_backends"))
    if not explicit or option.numprocesses is not None or config.getoption("usepdb", False):
        return
    if config.getoption("collectonly", False) or config.getoption("help", False):
        return
    option.numprocesses = 1
    if option.maxworkerrestart is None:  # one restart per crashed step; xdist's default stops at 4
        option.maxworkerrestart = str(CRASH_RESTARTS)


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


def suite_path() -> Path | None:
    """Where the installed conformance suite lives, found without importing it."""
    spec = importlib.util.find_spec(SUITE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(SESSION, None)
    if state is None or not state.explicit:
        return []
    profile = config.getoption("ptn_fuzz_profile")
    lines = [f"ptn: conformance spec v{SPEC_VERSION}; fuzz profile {profile}, --ptn-seed={state.seed}"]
    if config.getoption("numprocesses", None):
        lines.append("ptn: crash isolation on: tests run in xdist workers, a crash fails the test it hit")
    else:
        lines.append("ptn: crash isolation off (in-process run): a backend that crashes ends the run")
    for spec in state.requested:
        a = state.availability[spec]
        versions = ", ".join(f"{k} {v}" for k, v in a.versions.items())
        status = f"available ({versions})" if a.available else f"UNAVAILABLE: {a.reason}"
        lines.append(f"ptn backend {spec}: {status}")
        cls = state.classes[spec]
        for f in state.expectation_files:
            if f.applies_to(cls.name, a.versions):
                lines.append(f"ptn expectations for {cls.name}: {f.path} ({len(f.entries)} known failures)")
    return lines


def _scenarios(metafunc: pytest.Metafunc) -> list[Scenario]:
    marker = metafunc.definition.get_closest_marker("ptn_scenarios")
    if marker is None:
        return list(catalogue.SCENARIOS)
    return catalogue.tagged(*marker.args)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    state = metafunc.config.stash[SESSION]
    if "ptn_backend" in metafunc.fixturenames:
        metafunc.parametrize("ptn_backend", state.requested, indirect=True, scope="session")
    if "ptn_scenario" in metafunc.fixturenames:
        names = [s.name for s in _scenarios(metafunc)]
        metafunc.parametrize("ptn_scenario", names, indirect=True)


def rules_of(item: pytest.Item) -> list[str]:
    return [m.name for m in item.iter_markers() if m.name in RULES]


def _callspec_param(item: pytest.Item, name: str) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get(name) if callspec is not None else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput and workerinput.get("ptn_by_case"):  # see Xdist.pytest_xdist_make_scheduler
        items.sort(key=lambda item: _callspec_param(item, "ptn_scenario") is not None)
    for item in items:
        rules = rules_of(item)
        if not rules:
            continue
        backend = _callspec_param(item, "ptn_backend")
        scenario = _callspec_param(item, "ptn_scenario") or (
            "fuzz" if "ptn_fuzz" in getattr(item, "fixturenames", ()) else None
        )
        item.user_properties.extend(("ptn_rule", r) for r in rules)
        if backend is not None:
            item.user_properties.append(("ptn_backend", backend))
            repro = report.repro_command(item, backend, SUITE_PACKAGE, suite_path())
            item.user_properties.append(("ptn_repro", repro))
        if scenario is not None:
            item.user_properties.append(("ptn_scenario", scenario))
        if backend is not None:
            for e in config.stash[SESSION].expected(backend, rules, scenario):
                item.add_marker(pytest.mark.xfail(strict=True, reason=e.describe()))


@pytest.fixture(scope="session")
def ptn_backend(request: pytest.FixtureRequest) -> Backend:
    """The backend under test (one instance per run, so its caches live as long as a loader's would)."""
    return request.config.stash[SESSION].backend(request.param)


@pytest.fixture
def ptn_scenario(request: pytest.FixtureRequest) -> Scenario:
    return catalogue.BY_NAME[request.param]


@pytest.fixture
def ptn_case(
    request: pytest.FixtureRequest,
    ptn_backend: Backend,
    ptn_scenario: Scenario,
    tmp_path_factory: pytest.TempPathFactory,
) -> Case:
    """The (backend, scenario) under test; skipped as not applicable when the backend cannot show the rule."""
    from pytest_ptn.harness import Case

    skip_if_not_applicable(request.node, ptn_backend)
    if "torchao" in ptn_scenario.needs and importlib.util.find_spec("torchao") is None:
        pytest.skip(f"not applicable: {ptn_scenario.name} needs torchao (pip install torchao)")
    reason = ptn_backend.unsupported(ptn_scenario)
    if reason:
        pytest.skip(f"not applicable: {ptn_backend.name} cannot express {ptn_scenario.name}: {reason}")
    state = request.config.stash[SESSION]
    return Case(
        ptn_backend, ptn_scenario, lambda name: tmp_path_factory.mktemp(name), state.lowered, state.inspected
    )


@pytest.fixture
def ptn_fuzz(request: pytest.FixtureRequest, ptn_backend: Backend) -> Callable[[Callable[..., None]], Any]:
    """Decorator giving a ``@given`` test the run's fuzz profile and seed."""
    from hypothesis import seed, settings

    import pytest_ptn.strategies  # noqa: F401  registers the profiles

    skip_if_not_applicable(request.node, ptn_backend)
    profile = settings.get_profile(request.config.getoption("ptn_fuzz_profile"))
    run_seed = request.config.stash[SESSION].seed

    def apply(test: Callable[..., None]) -> Any:
        return seed(run_seed)(profile(test))

    return apply


def skip_if_not_applicable(item: pytest.Item, backend: Backend) -> None:
    for rule in rules_of(item):
        missing = RULE_NEEDS[rule] - backend.capabilities
        if missing:
            names = ", ".join(sorted(c.value for c in missing))
            pytest.skip(f"not applicable: backend {backend.name} has no {names} capability ({rule})")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, TestReport, TestReport]:
    """A SHOULD rule that fails is reported (as an expected failure naming the rule), not fatal to the run."""
    test_report = yield
    rules = rules_of(item)
    should_only = bool(rules) and all(RULES[r].level == "SHOULD" for r in rules)
    stale = isinstance(test_report.longrepr, str) and test_report.longrepr.startswith("[XPASS(strict)]")
    if test_report.when == "call" and test_report.failed and should_only and not stale:
        test_report.outcome = "skipped"
        test_report.wasxfail = f"{report.SHOULD_NOT_MET_PREFIX} {', '.join(rules)} not met"
    return test_report


# --- upstream warnings and logs (pytest_ptn.upstream_noise) ----------------------------------------------

UPSTREAM_WARNINGS = "ptn_upstream_warnings"
"""The key under which an xdist worker sends its tally of upstream warnings to the controller."""

UPSTREAM_TALLY = pytest.StashKey[upstream_noise.Tally]()


def upstream_tally(config: pytest.Config) -> upstream_noise.Tally:
    return config.stash.setdefault(UPSTREAM_TALLY, upstream_noise.Tally())


def _under_upstream_policy(item: pytest.Item) -> Generator[None, None, None]:
    """A phase of a test the plugin gives a backend runs under the suite's warning and logging policy; the
    host's own tests keep the host's."""
    if _callspec_param(item, "ptn_backend") is None:
        return (yield)
    show = item.config.getoption("ptn_upstream_logs")
    with upstream_noise.policy(upstream_tally(item.config), show):
        return (yield)


# trylast: inside pytest's own warning capture and its per-phase log handlers, so that the policy wins.
@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _under_upstream_policy(item))


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _under_upstream_policy(item))


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _under_upstream_policy(item))


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[UPSTREAM_WARNINGS] = upstream_tally(session.config).rows()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """Each xdist worker's tally joins the controller's (a worker that crashed sends none)."""
    upstream_tally(node.config).merge(getattr(node, "workeroutput", {}).get(UPSTREAM_WARNINGS, []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    summary = upstream_tally(terminalreporter.config).summary()
    if summary:
        terminalreporter.write_line(f"ptn: {summary}")
