"""One pytest run's state: the backends asked for, the seed, the expectations, and what its cases share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

from pytest_ptn import expectations
from pytest_ptn.backend import Availability, Backend

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from pytest_ptn.backend import Lowered


@dataclass
class LoweringCache:
    """What the tests of one run share per case, because computing it is slow: each (backend, scenario)
    lowering or the exception that rejected it, and each scenario's functionalized programs to inspect."""

    lowered: dict[tuple[int, str], Lowered | Exception] = field(default_factory=dict)
    inspected: dict[str, dict[str, ExportedProgram]] = field(default_factory=dict)


@dataclass
class RunState:
    """Plugin state for one pytest run (kept on ``config.stash``)."""

    requested: list[str]
    explicit: bool
    seed: int
    classes: dict[str, type[Backend]] = field(default_factory=dict)
    availability: dict[str, Availability] = field(default_factory=dict)
    instances: dict[str, Backend] = field(default_factory=dict)
    expectation_files: list[expectations.ExpectationFile] = field(default_factory=list)
    lowerings: LoweringCache = field(default_factory=LoweringCache)

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


RUN_STATE = pytest.StashKey[RunState]()
