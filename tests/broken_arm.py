"""Broken variants of ``ext:arm_tosa_fp``, each wrapped around the TOSA reference-model runner: the suite must
catch every one whose rule applies to an EXECUTE-only backend that keeps no state between calls (E1, E2,
A1; E3-E5 are not applicable to it). Its own module, as defining them reads executorch's flow registry with
the arm extra installed: only tests/test_arm_backend.py imports it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch.export import ExportedProgram

from pytest_ptn.backend import Loaded, Lowered
from pytest_ptn.backends.ext import flow_backend
from pytest_ptn.backends.tosa_reference import ReferenceModelLoaded, ReferenceModelLowered

FLOW = "arm_tosa_fp"


def _named(ep: ExportedProgram) -> dict[str, torch.Tensor]:
    """A method's parameters, buffers and lifted constants by the name the exported program gives them."""
    return {**ep.state_dict, **ep.constants}  # type: ignore[dict-item]


class ReadsTheFirstMethodsConstants(flow_backend(FLOW)):  # type: ignore[misc]
    """E1: every later method lowers with the first method's tensor wherever a name and shape collide, as a
    lowering that merges methods' constants by name binds them (executorch's external_constants, pte F3)."""

    name = "broken-arm-e1"

    def lower(self, programs: dict[str, ExportedProgram], workdir: Path) -> Lowered:
        first, *later = programs
        theirs = _named(programs[first])
        for method in later:
            ep = programs[method]
            for table in (ep.state_dict, ep.constants):
                for key, mine in table.items():
                    if key in theirs and theirs[key].shape == mine.shape:
                        other = theirs[key].detach().clone()
                        table[key] = (
                            torch.nn.Parameter(other, mine.requires_grad)
                            if isinstance(mine, torch.nn.Parameter)
                            else other
                        )  # type: ignore[index]
        return super().lower(programs, workdir)


class RejectsCollidingNames(flow_backend(FLOW)):  # type: ignore[misc]
    """E2: lowering refuses two methods holding different tensors under one name (executorch 1.5.1's
    to_native, before its namespace fix)."""

    name = "broken-arm-e2"

    def lower(self, programs: dict[str, ExportedProgram], workdir: Path) -> Lowered:
        seen: dict[str, tuple[str, torch.Tensor]] = {}
        for method, ep in programs.items():
            for key, tensor in _named(ep).items():
                owner, first = seen.setdefault(key, (method, tensor))
                if first.shape != tensor.shape or not torch.equal(first, tensor):
                    raise ValueError(f"constant {key!r} differs between methods {owner!r} and {method!r}")
        return super().lower(programs, workdir)


class _InexactLoaded(ReferenceModelLoaded):
    def run(self, method: str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [t * (1 + 2**-4) if t.is_floating_point() else t for t in super().run(method, inputs)]


class InexactReferenceModel(flow_backend(FLOW)):  # type: ignore[misc]
    """A1: every floating result comes out 6% high (a bad kernel): the method alone computes it so too, so it
    is accuracy, never isolation."""

    name = "broken-arm-a1"

    def load(self, lowered: Lowered) -> Loaded:
        assert isinstance(lowered, ReferenceModelLowered)
        return _InexactLoaded(lowered)
