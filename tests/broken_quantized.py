"""A deliberately broken quantized backend: the suite must catch a quantized method reading another method's
``_frozen_param0``. Its own module, as defining it reads executorch's flow registry (seconds): only the test
that runs it pays (tests/test_ext_backend.py)."""

from __future__ import annotations

from pathlib import Path

from torch.export import ExportedProgram

from pytest_ptn.backends.ext import flow_backend
from pytest_ptn.backends.pte import PteLowered

FLOW = "xnnpack_dynamic_int8_per_channel"
FROZEN = "_frozen_param0"


class ReadsAnotherMethodsFrozenParam(flow_backend(FLOW)):  # type: ignore[misc]
    """E1: every later method lowers with the first method's ``_frozen_param0`` in place of its own, as a
    loader or merged lowering that keys constants by name alone binds them (upstream's CUDA delegate cache, by
    FQN and metadata only): per-method quantization mints that name in every method, with other bytes."""

    name = "broken-quantized-e1"

    def lower(self, programs: dict[str, ExportedProgram], workdir: Path) -> PteLowered:
        first, *later = programs
        theirs = programs[first].state_dict[FROZEN]
        for method in later:
            mine = programs[method].state_dict
            if FROZEN in mine and mine[FROZEN].shape == theirs.shape:
                mine[FROZEN] = theirs.clone()
        return super().lower(programs, workdir)
