"""``--ptn-shard=K/N``: one machine of N runs a deterministic K-th part of the (backend, scenario) cases.

Every test of a case goes to the same shard, so each case is lowered on one machine only; a test outside any
case (the fuzz test of a backend) is a unit of its own. The units are dealt after ``-k``/``-m`` have
deselected, largest first and back and forth over the shards, so the shards get as many units (within one)
and about as many tests. The assignment depends only on what was collected, so N machines with the same
suite and arguments split it without talking to each other, and their ``results.json`` merge
(``python -m pytest_ptn report merge``) into the matrix of one unsharded run.

``--ptn-shard=auto`` reads K/N from the parallel-job variables of the CI system the run is in (`CI_SHARDS`);
where none is found it is a usage error, never a silent ``1/1`` that would run the whole suite N times.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_ptn.run.state import RUN_STATE
from pytest_ptn.scheduling import workers

OPTION = "--ptn-shard"
AUTO = "auto"
SHARD_FORMAT = re.compile(r"([1-9][0-9]*)/([1-9][0-9]*)")
"""``K/N`` of ``--ptn-shard``, as results.json records it."""
K8S_TOTAL = "PTN_SHARD_TOTAL"
"""The shard count of a Kubernetes Indexed Job, which gives each pod only its index: set it to the Job's
``completions``."""


@dataclass(frozen=True)
class CiShards:
    """Where one CI system says which of its parallel jobs this is: index and total variables, and whether
    the index counts from 0."""

    system: str
    index: str
    total: str
    zero_based: bool


CI_SHARDS = (
    CiShards("GitLab CI (parallel:)", "CI_NODE_INDEX", "CI_NODE_TOTAL", zero_based=False),
    CiShards("CircleCI (parallelism:)", "CIRCLE_NODE_INDEX", "CIRCLE_NODE_TOTAL", zero_based=True),
    CiShards(
        "Buildkite (parallelism:)", "BUILDKITE_PARALLEL_JOB", "BUILDKITE_PARALLEL_JOB_COUNT", zero_based=True
    ),
    CiShards(
        "Azure Pipelines (parallel: / matrix)", "SYSTEM_JOBPOSITIONINPHASE", "SYSTEM_TOTALJOBSINPHASE", False
    ),
    CiShards("Semaphore (parallelism:)", "SEMAPHORE_JOB_INDEX", "SEMAPHORE_JOB_COUNT", zero_based=False),
    CiShards(
        "Bitbucket Pipelines (parallel)", "BITBUCKET_PARALLEL_STEP", "BITBUCKET_PARALLEL_STEP_COUNT", True
    ),
    CiShards("Kubernetes Indexed Job", "JOB_COMPLETION_INDEX", K8S_TOTAL, zero_based=True),
)
"""The CI systems ``--ptn-shard=auto`` knows, in the order they are looked for."""

SHARD = pytest.StashKey["Shard"]()
"""The run's shard, for the report (results.json records K/N so a merge can name a missing one)."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def add_option(group: pytest.OptionGroup) -> None:
    group.addoption(
        OPTION,
        dest="ptn_shard",
        metavar="K/N",
        help="run only shard K of N (1 <= K <= N): a deterministic 1/N of the (backend, scenario) cases, "
        "every test of a case on one shard; merge the shards' results.json with "
        f"`python -m pytest_ptn report merge`. {AUTO}: K/N from the CI's parallel-job variables (GitLab, "
        f"CircleCI, Buildkite, Azure Pipelines, Semaphore, Bitbucket; a Kubernetes Indexed Job with "
        f"{K8S_TOTAL})",
    )


def parse(value: str) -> Shard:
    """``K/N`` as a Shard; a one-line usage error otherwise."""
    match = SHARD_FORMAT.fullmatch(value.strip())
    if match is None or not 1 <= int(match[1]) <= int(match[2]):
        raise pytest.UsageError(
            f"{OPTION}={value}: expected K/N with whole numbers 1 <= K <= N (or {AUTO}), e.g. {OPTION}=2/3"
        )
    return Shard(int(match[1]), int(match[2]))


def from_environment(env: Mapping[str, str]) -> tuple[Shard, str]:
    """The shard the CI environment gives this job, and where it came from (for the header)."""
    found: list[tuple[Shard, str]] = []
    for ci in CI_SHARDS:
        index, total = env.get(ci.index), env.get(ci.total)
        if index is None and total is None:
            continue
        if index is None or total is None:
            unset = ci.index if index is None else ci.total
            setting = "set it to the Job's completions" if unset == K8S_TOTAL else "is this job parallel?"
            raise pytest.UsageError(
                f"{OPTION}={AUTO}: {ci.system}: {ci.total if index is None else ci.index} is set but {unset} "
                f"is not ({setting})"
            )
        where = f"{ci.system}: {ci.index}={index}, {ci.total}={total}"
        if not (index.isdigit() and total.isdigit()):
            raise pytest.UsageError(f"{OPTION}={AUTO}: {where}: expected whole numbers")
        k, n = int(index) + ci.zero_based, int(total)
        if not 1 <= k <= n:
            first = 0 if ci.zero_based else 1
            raise pytest.UsageError(f"{OPTION}={AUTO}: {where}: the index must be {first}..{n - 1 + first}")
        found.append((Shard(k, n), where))
    if not found:
        systems = "; ".join(f"{ci.system} {ci.index}/{ci.total}" for ci in CI_SHARDS)
        raise pytest.UsageError(
            f"{OPTION}={AUTO}: no CI parallel-job variables here (looked for {systems}); give {OPTION}=K/N"
        )
    if len({shard for shard, _ in found}) > 1:
        raise pytest.UsageError(f"{OPTION}={AUTO}: CI variables disagree: {'; '.join(w for _, w in found)}")
    return found[0]


def configure(config: pytest.Config) -> None:
    value = config.getoption("ptn_shard")
    if value is None:
        return
    shard, source = from_environment(os.environ) if value.strip() == AUTO else (parse(value), None)
    config.stash[SHARD] = shard
    config.pluginmanager.register(Sharding(shard, config, source), "ptn-shard")


def unit_of(item: pytest.Item) -> str:
    """The case ``backend::scenario`` of a test parametrized with both (as workers.case_of names it), else
    the test's own id."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    if "ptn_backend" in params and "ptn_scenario" in params:
        return f"{params['ptn_backend']}::{params['ptn_scenario']}"
    return item.nodeid


def assign(units: dict[str, int], count: int) -> dict[str, int]:
    """The shard (0-based) of each unit, given its number of tests: largest first (ties by name), dealt
    0, 1, ..., N-1 then N-1, ..., 0, and so on, which keeps both the units and the tests per shard even."""
    order = sorted(units, key=lambda unit: (-units[unit], unit))
    shards: dict[str, int] = {}
    for position, unit in enumerate(order):
        round_, offset = divmod(position, count)
        shards[unit] = offset if round_ % 2 == 0 else count - 1 - offset
    return shards


class Sharding:
    """Deselects the tests of the other shards, and says in the header which shard runs how many cases."""

    def __init__(self, shard: Shard, config: pytest.Config, source: str | None = None):
        self.shard = shard
        self.config = config
        self.source = source
        self.described = False

    def pytest_report_header(self) -> str:
        option = OPTION if self.source is None else f"{OPTION}={AUTO} from {self.source}"
        return f"ptn: shard {self.shard} ({option}): a deterministic 1/{self.shard.count} of the cases"

    @pytest.hookimpl(trylast=True)  # after -k and -m: deal only what this run selected
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        units: dict[str, int] = {}
        for item in items:
            unit = unit_of(item)
            units[unit] = units.get(unit, 0) + 1
        shards = assign(units, self.shard.count)
        kept: list[pytest.Item] = []
        deselected: list[pytest.Item] = []
        for item in items:
            (kept if shards[unit_of(item)] == self.shard.index - 1 else deselected).append(item)
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = kept

    def pytest_report_collectionfinish(self, items: Sequence[pytest.Item]) -> str:
        return self.describe([item.nodeid for item in items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """Under xdist the workers collect and deal; the first to finish says what this shard runs."""
        if not self.described:
            self.config.get_terminal_writer().line(self.describe(ids))

    def describe(self, nodeids: list[str]) -> str:
        self.described = True
        state = self.config.stash[RUN_STATE]
        backends = sorted(state.requested, key=len, reverse=True)
        scenarios = state.scenario_names()
        cases = {workers.case_of(nodeid, backends, scenarios) for nodeid in nodeids}
        others = sum(workers.case_of(nodeid, backends, scenarios) is None for nodeid in nodeids)
        return (
            f"ptn shard {self.shard}: {len(cases - {None})} (backend, scenario) cases and {others} other "
            f"tests, {len(nodeids)} tests in all"
        )
