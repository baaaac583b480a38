"""Deliberately broken variants of the pte backend, named ``pte`` so that its shipped expectations apply:
the fuzz test must see each bug past pte's known mechanisms (tests/test_fuzz_mechanisms.py)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import torch

from pytest_ptn.backend import Lowered
from pytest_ptn.backends.pte import PteBackend, PteLoaded, PteLowered

NUMBERED = re.compile(r"m\d+")


class DoubledLoaded(PteLoaded):
    def run(self, method: str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        outputs = super().run(method, inputs)
        return [outputs[0] * 2, *outputs[1:]] if NUMBERED.fullmatch(method) else outputs


class DoublesNumberedMethods(PteBackend):
    """A bug only generated programs show: a method named ``m<digits>`` (no catalogue scenario has one)
    returns its first output doubled. Its values match no mechanism: unexplained."""

    name = "pte"

    def load(self, lowered: Lowered) -> DoubledLoaded:
        assert isinstance(lowered, PteLowered)
        return DoubledLoaded(lowered)


class ZeroesCollidingConstants(PteBackend):
    """A neighbour of pte's listed zero-filled state: lowering several methods at once zero-fills each
    constant whose name another method also holds (as a merge that keeps no data for colliding names would).
    Each method lowered alone is right; the program's values are those of ``zero-filled:constant``."""

    name = "pte"

    def lower(self, programs: dict[str, torch.export.ExportedProgram], workdir: Path) -> PteLowered:
        held: dict[str, int] = {}
        for ep in programs.values():
            for key in {*ep.constants, *ep.state_dict} - set(ep.graph_signature.buffers_to_mutate.values()):
                held[key] = held.get(key, 0) + 1
        with torch.no_grad():
            for ep in programs.values():
                for key, count in held.items():
                    tensor = ep.constants.get(key, ep.state_dict.get(key))
                    if (
                        count > 1
                        and isinstance(tensor, torch.Tensor)
                        and type(tensor)
                        in (
                            torch.Tensor,
                            torch.nn.Parameter,
                        )
                    ):
                        tensor.zero_()
        return super().lower(programs, workdir)
