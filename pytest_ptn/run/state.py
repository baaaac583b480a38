"""One pytest run's state: the backends asked for, the seed, the expectations, and what its cases share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

from pytest_ptn import expectations
from pytest_ptn.backend import Availability, Backend
from pytest_ptn.programs import catalogue, zoo

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from pytest_ptn.backend import Lowered
    from pytest_ptn.check.alone import MethodsAlone
    from pytest_ptn.check.explain import Replays
    from pytest_ptn.programs.user import NamedProgram, UserScenario
    from pytest_ptn.spec import ProgramSpec, Scenario

FAILING_PROGRAMS: pytest.StashKey[list[ProgramSpec]] = pytest.StashKey()
"""On a test item that draws its own programs (the fuzz test): the programs it failed on, one per unlisted
mechanism in the order its failure shows them, for a repro bundle each."""


@dataclass
class LoweringCache:
    """What the tests of one run share per case, because computing it is slow: each (backend, scenario)
    lowering or the exception that rejected it, its methods lowered alone (the truth of isolation), and each
    scenario's functionalized programs to inspect."""

    lowered: dict[tuple[int, str], Lowered | Exception] = field(default_factory=dict)
    alone: dict[tuple[int, str], MethodsAlone] = field(default_factory=dict)
    replays: dict[tuple[object, ...], Replays] = field(default_factory=dict)
    """(scenario, call sequence) -> what each faulty binding gives on it (pytest_ptn.check.explain)."""
    inspected: dict[str, dict[str, ExportedProgram]] = field(default_factory=dict)


@dataclass
class RunState:
    """Plugin state for one pytest run (kept on ``config.stash``)."""

    requested: list[str]
    explicit: bool
    seed: int
    run_zoo: bool = False
    """Whether the zoo's scenarios (upstream's models, ``--ptn-zoo``) are in the run."""
    classes: dict[str, type[Backend]] = field(default_factory=dict)
    availability: dict[str, Availability] = field(default_factory=dict)
    instances: dict[str, Backend] = field(default_factory=dict)
    expectation_files: list[expectations.ExpectationFile] = field(default_factory=list)
    lowerings: LoweringCache = field(default_factory=LoweringCache)
    user_programs: dict[str, NamedProgram] = field(default_factory=dict)
    """The host's own programs (the pytest_ptn_programs hook), by name."""
    _user_scenarios: dict[str, UserScenario] | None = None
    _zoo_scenarios: dict[str, UserScenario | zoo.ZooUnavailable] = field(default_factory=dict)

    def user_scenarios(self) -> dict[str, UserScenario]:
        """The user programs as scenarios, tagged on first use (that exports them: collection, not start-up);
        the programs their tags were read from are the cases' programs to inspect. A program that cannot be
        a scenario raises for every caller (nothing half-made is kept)."""
        if self._user_scenarios is None:
            made = {}
            for name, program in self.user_programs.items():
                made[name], self.lowerings.inspected[name] = program.scenario()
            self._user_scenarios = made
        return self._user_scenarios

    def zoo_scenario(self, name: str) -> UserScenario:
        """A zoo model as a scenario, built on first use (its tags are known without building it);
        zoo.ZooUnavailable, for every test that asks, if upstream's code no longer builds it."""
        if name not in self._zoo_scenarios:
            try:
                self._zoo_scenarios[name], self.lowerings.inspected[name] = zoo.BY_NAME[name].scenario()
            except zoo.ZooUnavailable as e:
                self._zoo_scenarios[name] = e
        found = self._zoo_scenarios[name]
        if isinstance(found, zoo.ZooUnavailable):
            raise found
        return found

    def scenario_names(self) -> list[str]:
        """Every scenario a case can be of: the catalogue's, the zoo's if it runs, then the user programs'
        (nothing exported)."""
        zoo_names = list(zoo.BY_NAME) if self.run_zoo else []
        return [*(s.name for s in catalogue.SCENARIOS), *zoo_names, *self.user_programs]

    def scenarios(self, *tags: str) -> list[Scenario | UserScenario | zoo.ZooModel]:
        """The catalogue's scenarios carrying every one of ``tags``, the zoo's if it runs, then the user
        programs that do."""
        users = [u for u in self.user_scenarios().values() if set(tags) <= u.tags]
        zoo_models = zoo.tagged(*tags) if self.run_zoo else []
        return [*catalogue.tagged(*tags), *zoo_models, *users]

    def names_tagged(self, *tags: str) -> list[str]:
        """The names of every scenario carrying ``tags`` that a run can have, the zoo's whether this run has
        them or not (nothing built)."""
        users = [u.name for u in self.user_scenarios().values() if set(tags) <= u.tags]
        return [*(s.name for s in catalogue.tagged(*tags)), *(m.name for m in zoo.tagged(*tags)), *users]

    def scenario(self, name: str) -> Scenario | UserScenario:
        """A scenario by name; zoo.ZooUnavailable for a zoo model that no longer builds."""
        if name in zoo.BY_NAME:
            return self.zoo_scenario(name)
        return catalogue.BY_NAME.get(name) or self.user_scenarios()[name]

    def expected(
        self, spec: str, rules: list[str], scenario: str | None, schedule: str | None = None
    ) -> list[expectations.Expectation]:
        """The entries that make a test of backend ``spec`` an expected failure (the fuzz test's list
        mechanisms instead: ``listed_mechanisms``)."""
        return [
            e
            for e in self._entries(spec)
            if e.mechanism is None and e.matches(self.classes[spec].name, rules, scenario, schedule)
        ]

    def listed_mechanisms(self, spec: str) -> dict[str, expectations.Expectation]:
        """mechanism key -> the entry listing it, for the fuzz test of backend ``spec``."""
        return {e.mechanism: e for e in self._entries(spec) if e.mechanism is not None}

    def _entries(self, spec: str) -> list[expectations.Expectation]:
        cls, versions = self.classes[spec], self.availability[spec].versions
        return [e for f in self.expectation_files if f.applies_to(cls.name, versions) for e in f.entries]

    def backend(self, spec: str) -> Backend:
        if spec not in self.instances:
            self.instances[spec] = self.classes[spec]()
        return self.instances[spec]


RUN_STATE = pytest.StashKey[RunState]()
