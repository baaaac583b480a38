"""The reference backend (SPEC section 3): the rules planner, the reference package and loader.

Lowering decomposes each method to functional core ATen, so mutations become graph outputs, then plans and
writes the package. Heavy imports happen inside methods: the plugin imports this module at start-up.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_ptn.backend import Availability, Backend, Capability, Lowered, package_version

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from pytest_ptn.instruments.content import SharingCache
    from pytest_ptn.reference.loader import ReferenceLoaded, ReferenceLowered
    from pytest_ptn.reference.planner import ConstantUse, PackagePlan


class ReferenceBackend(Backend):
    """SPEC section 3: needs nothing but torch and safetensors."""

    name = "reference"
    capabilities = frozenset(Capability) - {Capability.QUANTIZE}  # every view; it lowers programs as given

    def __init__(self) -> None:
        self._cache: SharingCache | None = None

    @property
    def cache(self) -> SharingCache:
        """One cache per backend instance, shared by every program it loads (so S4 means something)."""
        if self._cache is None:
            from pytest_ptn.instruments.content import SharingCache

            self._cache = SharingCache()
        return self._cache

    @classmethod
    def availability(cls) -> Availability:
        missing = [m for m in ("torch", "safetensors") if importlib.util.find_spec(m) is None]
        if missing:
            return Availability(False, f"missing {', '.join(missing)}")
        return Availability(True, versions={d: package_version(d) or "?" for d in ("torch", "safetensors")})

    def lower(self, programs: dict[str, ExportedProgram], workdir: Path) -> ReferenceLowered:
        from pytest_ptn.programs.exported import constants_of, functionalize, signature
        from pytest_ptn.reference.inputs import DECLARED_RANGES
        from pytest_ptn.reference.loader import ReferenceLowered
        from pytest_ptn.reference.package import Package, write_package

        decomposed = functionalize(programs)
        plan = self.plan({m: constants_of(ep) for m, ep in decomposed.items()})
        bindings = {m: signature(ep, plan.bindings[m]) for m, ep in decomposed.items()}
        path = workdir / "program.ptpkg"
        write_package(path, Package(plan.entries, plan.aliases, bindings, sorted(plan.state_keys)))
        for ep in decomposed.values():  # the sizes each method admits, as the loader refuses others
            ep.graph_module.meta[DECLARED_RANGES] = ep.range_constraints
        return ReferenceLowered(path, {m: ep.graph_module for m, ep in decomposed.items()})

    def plan(self, methods: Mapping[str, Mapping[str, ConstantUse]]) -> PackagePlan:
        from pytest_ptn.reference.planner import plan_package

        return plan_package(methods)

    def load(self, lowered: Lowered) -> ReferenceLoaded:
        from pytest_ptn.reference.loader import ReferenceLoaded, ReferenceLowered
        from pytest_ptn.reference.package import read_package

        assert isinstance(lowered, ReferenceLowered)
        return ReferenceLoaded(read_package(lowered.path), lowered.graphs, self.cache)
