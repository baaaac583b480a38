"""The pytest plugin: ``--ptn-backend``, rule markers, backend x scenario parametrization, the header.

Loading it imports neither torch nor executorch (backends import them when they lower or load), so a
repository that has pytest-ptn installed pays nothing in runs that do not use it.
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _pytest.reports import TestReport

from pytest_ptn import expectations, mechanisms, upstream_noise
from pytest_ptn.backend import (
    OWNED_PROPERTY,
    VARIANT_SEPARATOR,
    Backend,
    BackendError,
    Capability,
    availability_of,
    resolve_backend,
    runtime_availability,
)
from pytest_ptn.fuzzing import progress
from pytest_ptn.fuzzing.run import FuzzRun, FuzzShare
from pytest_ptn.programs import catalogue, zoo
from pytest_ptn.reporting import collect, repro, results, runtime_log
from pytest_ptn.ruleset import (
    RULE_NEEDS,
    RULES,
    SHOULD,
    SPEC_VERSION,
    WAITS_FOR_CLOCK,
    is_strict_xpass,
    should_not_met,
)
from pytest_ptn.run import hookspecs, not_exercised, stopping
from pytest_ptn.run.failure import FOUND, Found, carried, raised_by_backend
from pytest_ptn.run.not_applicable import OUTCOME_PROPERTY, is_not_applicable, skip_not_applicable
from pytest_ptn.run.state import RUN_STATE, RunState
from pytest_ptn.schedule import LoadSchedule
from pytest_ptn.scheduling import crashes, gpus, hangs, shards, workers
from pytest_ptn.spec import Scenario

if TYPE_CHECKING:
    from pytest_ptn.harness import Case
    from pytest_ptn.programs.user import NamedProgram, UserScenario

DEFAULT_BACKEND = "reference"
SUITE_PACKAGE = "pytest_ptn.conformance"


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
    group.addoption(
        "--ptn-zoo",
        action="store_true",
        help="also run the zoo: upstream's own models (executorch.examples.models: a llama with a KV cache, "
        "the Voxtral Realtime encoder-decoder), tiny, in float32 and bf16; it costs about as much again as "
        "the rest of the suite, so it is opt-in (the nightly job runs it); -m zoo runs only the zoo",
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
    collect.add_options(group)
    repro.add_option(group)
    shards.add_option(group)
    gpus.add_option(group)
    hangs.add_options(parser, group)


def pytest_configure(config: pytest.Config) -> None:
    for rule in RULES.values():
        config.addinivalue_line(
            "markers", f"{rule.id}: conformance rule {rule.id} ({rule.level}): {rule.title}"
        )
    config.addinivalue_line(
        "markers",
        "ptn_scenarios(tag): run this conformance test on every scenario with this tag (catalogue and own)",
    )
    config.addinivalue_line(
        "markers", f"{zoo.ZOO_TAG}: a test on a zoo scenario, upstream's own models (pytest_ptn.programs.zoo)"
    )
    cli = config.getoption("ptn_backends") or []
    ini = config.getini("ptn_backends")
    requested = list(dict.fromkeys(variants(cli or ini or [DEFAULT_BACKEND])))
    workerinput = getattr(config, "workerinput", None)
    seed = config.getoption("ptn_seed")
    if seed is None:  # one seed for the run: xdist workers get the controller's (pytest_configure_node)
        seed = workerinput["ptn_seed"] if workerinput else random.randrange(2**32)
    state = RunState(requested, explicit=bool(cli or ini), seed=seed, run_zoo=config.getoption("ptn_zoo"))
    config.stash[RUN_STATE] = state
    if config.getoption("help", False):
        return
    if workerinput and "ptn_sys_path" in workerinput:  # backends the controller could import, workers can
        sys.path[:0] = [p for p in workerinput["ptn_sys_path"] if p not in sys.path]
    hangs.limit(config)  # a bad value is a usage error now, not in every worker
    collect.configure(config)
    runtime_log.configure(config)
    stopping.configure(config, state.explicit)
    repro.configure(config)
    shards.configure(config)
    gpus.configure(config)
    xdist = None
    if config.pluginmanager.hasplugin("xdist"):
        xdist = workers.Xdist(state, config)
        config.pluginmanager.register(xdist, "ptn-xdist")
        if hasattr(config, "workerinput") and state.explicit:
            config.pluginmanager.register(workers.CrashIsolatedWorker(config), "ptn-crash-worker")
    if workerinput is None:
        folder = xdist.run_folder if xdist is not None and workers.is_controller(config) else None
        config.stash[FUZZ_BOARD] = progress.Board(terminal_line(config), folder)
    for spec in requested:
        try:
            cls = resolve_backend(spec)
            with backend_call(config, spec, "availability()"):
                state.availability[spec] = availability_of(spec, cls)
        except BackendError as e:
            raise pytest.UsageError(f"--ptn-backend: {e}") from e
        except hangs.HungCall as e:
            raise pytest.UsageError(str(e)) from None
        state.classes[spec] = cls
        if state.explicit and not state.availability[spec].available:
            raise pytest.UsageError(
                f"--ptn-backend={spec} is unavailable on this machine: {state.availability[spec].reason}"
            )
    state.user_programs = user_programs(config)
    suite = suite_path()
    if not config.getoption("ptn_no_expectations"):
        given = config.getoption("ptn_expectations")
        paths = [Path(p) for p in given] if given else expectations.shipped(suite)
        try:
            state.expectation_files = [expectations.read(p, set(state.user_programs)) for p in paths]
        except expectations.ExpectationsError as e:
            raise pytest.UsageError(f"--ptn-expectations: {e}") from e
        names = {cls.name for cls in state.classes.values()}
        foreign = [f for f in state.expectation_files if f.backend not in names] if given else []
        if foreign and state.explicit:
            raise pytest.UsageError(
                f"--ptn-expectations: {foreign[0].path} is about backend {foreign[0].backend!r}, and this "
                f"run tests {', '.join(sorted(names))}: its known failures would apply to nothing"
            )
    from_args = config.args_source == pytest.Config.ArgsSource.ARGS
    if state.explicit and not from_args and suite is not None and str(suite) not in config.args:
        config.args.append(str(suite))


FUZZ_BOARD = pytest.StashKey[progress.Board]()
"""In the process that owns the terminal: how far the run's fuzz shares are (pytest_ptn.fuzzing.progress)."""


def terminal_line(config: pytest.Config) -> Callable[[str], None]:
    """A line on pytest's terminal, from inside a test too (its capture suspended while the line goes)."""

    def say(line: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        capture = config.pluginmanager.get_plugin("capturemanager")
        if reporter is None:
            return
        if capture is None:
            reporter.write_line(line)
            return
        with capture.global_and_fixture_disabled():
            reporter.write_line(line)

    return say


def pytest_sessionstart(session: pytest.Session) -> None:
    board = session.config.stash.get(FUZZ_BOARD, None)
    if board is not None and board.folder is not None:
        board.watch()


def fuzz_progress(
    config: pytest.Config, backend: str, share: FuzzShare, budget: int
) -> Callable[[int], None]:
    """How a fuzz share tells the terminal its count: a file for the controller from an xdist worker, the
    board itself in an in-process run."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "ptn_run_folder" in workerinput:
        folder = Path(workerinput["ptn_run_folder"])
        return lambda done: progress.write(folder, progress.Progress(backend, str(share), done, budget))
    board = config.stash.get(FUZZ_BOARD, None)
    if board is None:
        return lambda done: None
    return lambda done: board.record(progress.Progress(backend, str(share), done, budget))


def variants(specs: list[str]) -> list[str]:
    """Each requested backend, a name that stands for several (``Backend.variants``: a runtime of .pte files
    and the lowerings it runs) as each of them, ``name@variant``; a name that does not resolve stays as given,
    for the usage error that names it."""
    out = []
    for spec in specs:
        try:
            found = resolve_backend(spec).variants()
        except BackendError:
            found = ()
        out += [f"{spec}{VARIANT_SEPARATOR}{v}" for v in found] or [spec]
    return out


def backend_call(config: pytest.Config, spec: str, call: str) -> AbstractContextManager[None]:
    """A call into backend ``spec`` outside any case: a step under the watchdog in a crash-isolated worker,
    limited in the controller (pytest_ptn.scheduling.hangs); in-process runs have no limit."""
    if workers.is_controller(config):
        return hangs.limited(hangs.limit(config), f"--ptn-backend={spec}: {call}")
    return crashes.calling(spec, call)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def user_programs(config: pytest.Config) -> dict[str, NamedProgram]:
    """The host's own programs (its conftest's ``pytest_ptn_programs``), asked once, before expectation files
    are read, so that those can name them and a misspelt name is still an error."""
    answers = [p for answer in config.hook.pytest_ptn_programs(config=config) for p in answer]
    if not answers:
        return {}
    from pytest_ptn.programs.user import NamedProgramError, by_name

    try:
        return by_name(answers, {*catalogue.BY_NAME, *zoo.BY_NAME, expectations.FUZZ_SCENARIO})
    except NamedProgramError as e:
        raise pytest.UsageError(f"pytest_ptn_programs: {e}") from e


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> Generator[None, object, object]:
    """A conformance run without ``-n`` goes to one xdist worker, so a backend that kills its process fails
    the test it was running instead of ending the run. ``-n 0`` (or ``-p no:xdist``, ``--pdb``) runs in
    process. Decided here, before any plugin reads the command line: pytest-cov chooses between measuring
    this process and combining its workers' measures in this hook, and a run made distributed after that
    (in pytest_cmdline_main) ended in an INTERNALERROR. A wrapper, so it runs before every plugin's own
    implementation (pytest-cov's is tryfirst)."""
    workers.one_worker_by_default(early_config)
    return (yield)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    return gpus.auto_workers(config)


def suite_path() -> Path | None:
    """Where the installed conformance suite lives, found without importing it; in a source checkout run
    with nothing installed (``-p pytest_ptn.plugin``), the checkout's ``conformance/``."""
    spec = importlib.util.find_spec(SUITE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        checkout = Path(__file__).parents[1] / "conformance"
        return checkout if (checkout / "__init__.py").is_file() else None
    return Path(next(iter(spec.submodule_search_locations)))


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(RUN_STATE, None)
    if state is None or not state.explicit:
        return []
    profile = config.getoption("ptn_fuzz_profile")
    lines = [f"ptn: conformance spec v{SPEC_VERSION}; fuzz profile {profile}, --ptn-seed={state.seed}"]
    limit = hangs.limit(config)
    if config.getoption("numprocesses", None):
        hung = f"a step with {hangs.no_progress(limit)} fails as hung" if limit else "no time limit"
        isolated = "ptn: crash isolation on: tests run in xdist workers, a crash fails the test it hit"
        lines.append(f"{isolated}, {hung}")
    else:
        lines.append(
            "ptn: crash isolation off (in-process run): a backend that crashes ends the run, and one that "
            f"hangs is not isolated either ({hangs.OPTION} applies in xdist workers only)"
        )
    for spec in state.requested:
        a = state.availability[spec]
        versions = ", ".join(f"{k} {v}" for k, v in a.versions.items())
        status = f"available ({versions})" if a.available else f"UNAVAILABLE: {a.reason}"
        if a.available and a.reason:
            status += f"; {a.reason}"
        lines.append(f"ptn backend {spec}: {status}")
        cls = state.classes[spec]
        for f in state.expectation_files:
            if f.applies_to(cls.name, a.versions):
                lines.extend(f.summary())
    return lines + program_hazards(state)


def program_hazards(state: RunState) -> list[str]:
    """Each of the host's own programs with what it holds that the rules are about, and the rules it
    leaves with no case to check (pytest_ptn.check.hazards): a green run on it says what it covered. A
    program that cannot be made a scenario is told here in a line and fails collection with the reason."""
    if not state.user_programs:
        return []
    from pytest_ptn.backend import one_line
    from pytest_ptn.check.hazards import hazards_of

    try:
        state.user_scenarios()  # exports and inspects each program once, for the run's cases too
    except Exception as e:
        return [f"ptn programs: their hazards cannot be read: {one_line(e)}"]
    lines = []
    for name, program in state.user_programs.items():
        found = hazards_of(state.lowerings.inspected[name], program.sequence, program.constant_methods)
        lines.append(f"ptn program {name}: methods {', '.join(program.method_names)}")
        lines += [f"  {line}" for line in found.lines()]
    return lines


def _scenarios(metafunc: pytest.Metafunc) -> list[Scenario | UserScenario | zoo.ZooModel]:
    marker = metafunc.definition.get_closest_marker("ptn_scenarios")
    return metafunc.config.stash[RUN_STATE].scenarios(*(marker.args if marker else ()))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    state = metafunc.config.stash[RUN_STATE]
    if "ptn_backend" in metafunc.fixturenames:
        metafunc.parametrize("ptn_backend", state.requested, indirect=True, scope="session")
    if "ptn_scenario" in metafunc.fixturenames:
        names = [s.name for s in _scenarios(metafunc)]
        metafunc.parametrize("ptn_scenario", names, indirect=True)
    if "ptn_schedule" in metafunc.fixturenames:
        metafunc.parametrize("ptn_schedule", [s.value for s in LoadSchedule], indirect=True)
    if "ptn_fuzz_share" in metafunc.fixturenames and (count := fuzz_shares(metafunc.config)) > 1:
        shares = [FuzzShare(i, count) for i in range(count)]
        metafunc.parametrize("ptn_fuzz_share", shares, indirect=True, ids=str)


def rules_of(item: pytest.Item) -> list[str]:
    return [m.name for m in item.iter_markers() if m.name in RULES]


def _callspec_param(item: pytest.Item, name: str) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get(name) if callspec is not None else None


@pytest.hookimpl(tryfirst=True)  # in an xdist worker: before xdist tells the controller what it collected
def pytest_collection_finish(session: pytest.Session) -> None:
    """Where tests are about to run (in this process, or in this xdist worker), each requested backend that
    tests use loads its runtime first: one that cannot (an extension built against another torch) is a usage
    error naming why, never a run of failures. A worker writes it down for the controller, which ends the
    run with it (pytest_ptn.scheduling.workers); ``availability()`` alone stays cheap at plugin start."""
    config = session.config
    state = config.stash.get(RUN_STATE, None)
    if state is None or not state.explicit or workers.is_controller(config) or config.option.collectonly:
        return
    used = {_callspec_param(item, "ptn_backend") for item in session.items}
    for spec in (s for s in state.requested if s in used):
        with backend_call(config, spec, "load_runtime()"):
            state.availability[spec] = runtime_availability(state.classes[spec], state.availability[spec])
        if not state.availability[spec].available:
            message = (
                f"--ptn-backend={spec} is unavailable on this machine: {state.availability[spec].reason}"
            )
            if hasattr(config, "workerinput"):
                workers.note_usage_error(config, message)
                return
            raise pytest.UsageError(message)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput and workerinput.get("ptn_by_case"):  # see Xdist.pytest_xdist_make_scheduler
        items.sort(key=lambda item: _callspec_param(item, "ptn_scenario") is not None)
    items.sort(key=lambda item: not WAITS_FOR_CLOCK.isdisjoint(rules_of(item)))
    suite = suite_path()  # a module lookup: once, not per test
    for item in items:
        rules = rules_of(item)
        if not rules:
            continue
        backend = _callspec_param(item, "ptn_backend")
        scenario = _callspec_param(item, "ptn_scenario") or (
            expectations.FUZZ_SCENARIO if "ptn_fuzz" in getattr(item, "fixturenames", ()) else None
        )
        item.user_properties.extend(("ptn_rule", r) for r in rules)
        if backend is not None:
            item.user_properties.append(("ptn_backend", backend))
            repro = collect.repro_command(item, backend, SUITE_PACKAGE, suite)
            item.user_properties.append(("ptn_repro", repro))
        if scenario is not None:
            item.user_properties.append(("ptn_scenario", scenario))
        schedule = _callspec_param(item, "ptn_schedule")
        if schedule is not None:
            item.user_properties.append(("ptn_schedule", schedule))
        if scenario in zoo.BY_NAME:
            item.add_marker(zoo.ZOO_TAG)
        if backend is not None:
            mark_expected(item, config.stash[RUN_STATE].expected(backend, rules, scenario, schedule))
    refuse_entries_matching_no_test(config, items)


def refuse_entries_matching_no_test(config: pytest.Config, items: list[pytest.Item]) -> None:
    """An expectation entry no test of the suite can match (P6 on a scenario no P6 test runs) is a usage
    error naming it, as a malformed entry is: it would be counted as a known failure and never reported. In
    an xdist worker it is written down for the controller, which ends the run with it."""
    state = config.stash[RUN_STATE]
    if not state.explicit:
        return
    entries = [
        e
        for spec in state.requested
        for f in state.expectation_files
        if f.applies_to(state.classes[spec].name, state.availability[spec].versions)
        for e in f.entries
    ]
    unmatched = expectations.matching_no_test(entries, suite_cells(state, items)) if entries else []
    if not unmatched:
        return
    lines = [f"{e.cell()} ({e.source})" for e in dict.fromkeys(unmatched)]
    message = (
        f"--ptn-expectations: {len(lines)} known failure entries match no test of the suite, and would "
        f"never be reported; remove them, as a stale entry: {'; '.join(lines)}"
    )
    if hasattr(config, "workerinput"):
        workers.note_usage_error(config, message)
        return
    raise pytest.UsageError(message)


def suite_cells(state: RunState, items: list[pytest.Item]) -> set[tuple[str, str | None, str | None]]:
    """Every (rule, scenario, schedule) the functions of the collected tests check, whichever of their
    parameters this run selected (the zoo's scenarios too, run or not)."""
    cells: set[tuple[str, str | None, str | None]] = set()
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "ptn_scenario" in fixtures:
            marker = item.get_closest_marker("ptn_scenarios")
            scenarios: list[str | None] = [*state.names_tagged(*(marker.args if marker else ()))]
        else:
            scenarios = [expectations.FUZZ_SCENARIO if "ptn_fuzz" in fixtures else None]
        schedules: list[str | None] = (
            [s.value for s in LoadSchedule] if "ptn_schedule" in fixtures else [None]
        )
        cells.update((r, sc, sh) for r in rules_of(item) for sc in scenarios for sh in schedules)
    return cells


def mark_expected(item: pytest.Item, expected: list[expectations.Expectation]) -> None:
    """Listed failures are strict xfails; a test an intermittent entry lists may pass or fail (a non-strict
    xfail, never stale), and is reported apart."""
    intermittent = [e for e in expected if e.intermittent]
    if intermittent:
        item.add_marker(pytest.mark.xfail(strict=False, reason=intermittent[0].describe()))
        item.user_properties.append((collect.INTERMITTENT_PROPERTY, "1"))
        return
    for e in expected:
        item.add_marker(pytest.mark.xfail(strict=True, reason=e.describe()))


@pytest.fixture(scope="session")
def ptn_backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Backend:
    """The backend under test (one instance per run, so its caches live as long as a loader's would)."""
    runtime_log.use_temporary_folder(request.config, tmp_path_factory)
    with backend_call(request.config, request.param, "__init__"):
        return request.config.stash[RUN_STATE].backend(request.param)


@pytest.fixture
def ptn_scenario(request: pytest.FixtureRequest) -> Scenario | UserScenario:
    """A catalogue scenario, a zoo model (skipped, naming the change, if upstream's code no longer builds
    it), or one of the host's own programs (pytest_ptn_programs)."""
    try:
        return request.config.stash[RUN_STATE].scenario(request.param)
    except zoo.ZooUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture
def ptn_schedule(request: pytest.FixtureRequest) -> LoadSchedule:
    """When the case's methods load: all before the first call, or each at its first call (E rules)."""
    return LoadSchedule(request.param)


@pytest.fixture
def ptn_case(
    request: pytest.FixtureRequest,
    ptn_backend: Backend,
    ptn_scenario: Scenario | UserScenario,
    tmp_path_factory: pytest.TempPathFactory,
) -> Case:
    """The (backend, scenario) under test; skipped as not applicable when the backend cannot show the rule."""
    from pytest_ptn.harness import Case

    skip_if_not_applicable(request.node, ptn_backend)
    if "torchao" in ptn_scenario.needs and importlib.util.find_spec("torchao") is None:
        skip_not_applicable(f"{ptn_scenario.name} needs torchao (pip install torchao)")
    mismatch = quantization_mismatch(ptn_backend, ptn_scenario.tags)
    if mismatch:
        skip_not_applicable(f"{ptn_backend.name} on {ptn_scenario.name}: {mismatch}")
    reason = ptn_backend.unsupported(ptn_scenario) if isinstance(ptn_scenario, Scenario) else None
    if reason:
        skip_not_applicable(f"{ptn_backend.name} cannot express {ptn_scenario.name}: {reason}")
    stateless = ptn_backend.keeps_no_state()
    if stateless and isinstance(ptn_scenario, Scenario) and ptn_scenario.spec.written():
        name = f"{ptn_backend.name} on {ptn_scenario.name}"
        skip_not_applicable(f"{name}, a program that writes state: {stateless}")
    state = request.config.stash[RUN_STATE]
    return Case(ptn_backend, ptn_scenario, lambda name: tmp_path_factory.mktemp(name), state.lowerings)


def quantization_mismatch(backend: Backend, tags: frozenset[str]) -> str | None:
    """Why a scenario with ``tags`` does not apply to ``backend``: one that quantizes each method runs only
    the quantization-friendly scenarios (catalogue.QUANTIZABLE), a float backend every other one."""
    quantizes = Capability.QUANTIZE in backend.capabilities
    if quantizes and catalogue.QUANTIZABLE not in tags:
        return (
            f"it quantizes each method, and this program is not quantization-friendly (scenarios tagged "
            f"{catalogue.QUANTIZABLE!r} are: linear layers, no 0-d intermediate)"
        )
    if not quantizes and catalogue.QUANTIZABLE in tags:
        return (
            "a quantization-friendly program, for backends that quantize each method; its float collisions, "
            "shared weights and KV cache are in the other scenarios"
        )
    return None


def fuzz_shares(config: pytest.Config) -> int:
    """How many parts the fuzz budget is split into: the workers of a machine times the machines. Every
    worker collects the same items, so the count comes from what every worker knows alike."""
    workerinput = getattr(config, "workerinput", None)
    workers = int(workerinput["workercount"]) if workerinput else 1
    machines = config.stash[shards.SHARD].count if shards.SHARD in config.stash else 1
    return workers * machines


@pytest.fixture
def ptn_fuzz_share(request: pytest.FixtureRequest) -> FuzzShare:
    """This item's share of the fuzz budget (the whole of it where the run has one worker)."""
    param = getattr(request, "param", None)
    return param if isinstance(param, FuzzShare) else FuzzShare(0, 1)


@pytest.fixture
def ptn_fuzz(request: pytest.FixtureRequest, ptn_backend: Backend, ptn_fuzz_share: FuzzShare) -> FuzzRun:
    """Decorator giving a ``@given`` test the run's fuzz profile and seed, and what the backend's
    expectations list (FuzzRun)."""
    from hypothesis import settings

    import pytest_ptn.strategies  # noqa: F401  registers the profiles

    skip_if_not_applicable(request.node, ptn_backend)
    if Capability.QUANTIZE in ptn_backend.capabilities:
        name = ptn_backend.name
        skip_not_applicable(f"{name} quantizes each method; generated programs compute 0-d sums")
    state = request.config.stash[RUN_STATE]
    profile = settings.get_profile(request.config.getoption("ptn_fuzz_profile"))
    spec = _callspec_param(request.node, "ptn_backend") or ptn_backend.name
    listed = state.listed_mechanisms(spec) if spec in state.classes else {}
    run = FuzzRun(profile, state.seed, ptn_fuzz_share, listed)
    run.progress = fuzz_progress(request.config, spec, ptn_fuzz_share, run.budget)
    run.limit = hangs.limit(request.config)
    return run


def skip_if_not_applicable(item: pytest.Item, backend: Backend) -> None:
    for rule in rules_of(item):
        missing = RULE_NEEDS[rule] - backend.capabilities
        if missing:
            names = ", ".join(sorted(c.value for c in missing))
            skip_not_applicable(f"backend {backend.name} has no {names} capability ({rule})")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, TestReport, TestReport]:
    """A SHOULD rule that fails is reported (as an expected failure naming the rule), not fatal to the run;
    a failed test carries its failure's mechanisms to the reports (mechanisms.PROPERTY)."""
    test_report = yield
    if test_report.when == "call" and call.excinfo is not None:
        found = failure_found(item, call.excinfo.value)
        test_report.user_properties = carried(test_report.user_properties, found)
    if call.excinfo is not None and is_not_applicable(call.excinfo.value):
        marked = (OUTCOME_PROPERTY, results.NOT_APPLICABLE)
        test_report.user_properties = [*test_report.user_properties, marked]
    rules = rules_of(item)
    if test_report.when == "call":
        held_by_backend(item, rules, test_report)
    should_only = bool(rules) and all(RULES[r].level == SHOULD for r in rules)
    stale = is_strict_xpass(test_report.longrepr)
    if test_report.when == "call" and test_report.failed and should_only and not stale:
        test_report.outcome = "skipped"
        test_report.wasxfail = should_not_met(rules)
        test_report.user_properties = [*test_report.user_properties, (OUTCOME_PROPERTY, results.FAIL)]
    return test_report


def held_by_backend(item: pytest.Item, rules: list[str], test_report: TestReport) -> None:
    """Carry how many of the checked constants the backend under test held (OWNED_PROPERTY), where it says
    (``Lowered.ownership``); a passed test that judges how they are held, on a program it held none of,
    ends not exercised (pytest_ptn.run.not_exercised)."""
    from pytest_ptn.harness import Case

    case = getattr(item, "funcargs", {}).get(repro.CASE_FIXTURE)
    ownership = case.ownership() if isinstance(case, Case) else None
    counts = ownership.counts() if ownership is not None else item.stash.get(not_exercised.HELD, None)
    if counts is None:
        return
    held, checked = counts
    counted = (OWNED_PROPERTY, json.dumps([held, checked]))
    test_report.user_properties = [*test_report.user_properties, counted]
    if test_report.passed and not_exercised.unexercised(rules, held, checked):
        path, line, _ = item.reportinfo()
        why = not_exercised.reason(_callspec_param(item, "ptn_backend") or "the backend", checked)
        test_report.outcome = "skipped"
        test_report.longrepr = (str(path), (line or 0) + 1, f"Skipped: {why}")
        marked = (OUTCOME_PROPERTY, results.NOT_EXERCISED)
        test_report.user_properties = [*test_report.user_properties, marked]


def failure_found(item: pytest.Item, error: BaseException) -> Found:
    """How a conformance test's failure came about, and whose it is: what a test that judges on its own left
    on its item (the fuzz: ``FOUND``), else what its case says (``Case.failure``), else, for an exception no
    check made, that exception's own mechanism."""
    from pytest_ptn.harness import Case

    if FOUND in item.stash:
        return item.stash[FOUND]
    if _callspec_param(item, "ptn_backend") is None:
        return Found(())
    case = getattr(item, "funcargs", {}).get(repro.CASE_FIXTURE)
    if isinstance(case, Case):
        return case.failure(error)
    # no case, no program: no method names to leave out
    return Found((mechanisms.raised(mechanisms.Step.RUNNING, error, ()),) if raised_by_backend(error) else ())


# --- upstream warnings and logs (pytest_ptn.upstream_noise) ----------------------------------------------

UPSTREAM_WARNINGS = "ptn_upstream_warnings"
"""The key under which an xdist worker sends its tally of upstream warnings to the controller."""

UPSTREAM_TALLY = pytest.StashKey[upstream_noise.Tally]()


def upstream_tally(config: pytest.Config) -> upstream_noise.Tally:
    return config.stash.setdefault(UPSTREAM_TALLY, upstream_noise.Tally())


def _under_upstream_policy(item: pytest.Item) -> Generator[None, None, None]:
    """A phase of a test the plugin gives a backend runs under the suite's warning and logging policy; the
    host's own tests keep the host's."""
    spec = _callspec_param(item, "ptn_backend")
    if spec is None:
        return (yield)
    show = item.config.getoption("ptn_upstream_logs")
    owner = item.config.stash[RUN_STATE].classes[spec].__module__.split(".")[0]
    with upstream_noise.policy(upstream_tally(item.config), show, owner):
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
    board = session.config.stash.get(FUZZ_BOARD, None)
    if board is not None:
        board.close()
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
