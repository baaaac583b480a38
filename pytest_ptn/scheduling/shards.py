"""``--ptn-shard=K/N``: one machine of N runs a deterministic K-th part of the (backend, scenario) cases.

Every test of a case goes to the same shard, so each case is lowered on one machine only; a test outside any
case (the fuzz test of a backend) is a unit of its own. The units are dealt after ``-k``/``-m`` have
deselected, largest first and back and forth over the shards, so the shards get as many units (within one)
and about as many tests. The assignment depends only on what was collected, so N machines with the same
suite and arguments split it without talking to each other, and their ``results.json`` merge
(``python -m pytest_ptn report merge``) into the matrix of one unsharded run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_ptn.scheduling import workers
from pytest_ptn.session import RUN_STATE

OPTION = "--ptn-shard"
SHARD_FORMAT = re.compile(r"(\d+)/(\d+)")


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
        "`python -m pytest_ptn report merge`",
    )


def parse(value: str) -> Shard:
    """``K/N`` as a Shard; a one-line usage error otherwise."""
    match = SHARD_FORMAT.fullmatch(value.strip())
    if match is None or not 1 <= int(match[1]) <= int(match[2]):
        raise pytest.UsageError(
            f"{OPTION}={value}: expected K/N with whole numbers 1 <= K <= N, e.g. {OPTION}=2/3"
        )
    return Shard(int(match[1]), int(match[2]))


def configure(config: pytest.Config) -> None:
    value = config.getoption("ptn_shard")
    if value is not None:
        config.pluginmanager.register(Sharding(parse(value), config), "ptn-shard")


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

    def __init__(self, shard: Shard, config: pytest.Config):
        self.shard = shard
        self.config = config
        self.described = False

    def pytest_report_header(self) -> str:
        return f"ptn: shard {self.shard} ({OPTION}): a deterministic 1/{self.shard.count} of the cases"

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
