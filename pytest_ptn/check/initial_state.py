"""E5 at load, judged once for the scenario tests and check_program: each buffer as loaded is eager's initial
value exactly (SPEC: nothing computed it yet, so no arithmetic bound applies)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def initial_state_wrong(
    state: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor], written: Collection[str]
) -> list[str]:
    """What the state view shows wrong at load, one line per buffer: each of eager's ``buffers`` (key ->
    initial value) that the view shows with another shape or other bytes in eager's dtype, or that it lacks
    though some method writes it (``written``: the keys of those)."""
    wrong = []
    for key, want in buffers.items():
        have = state.get(key)
        if have is None:
            if key in written:
                wrong.append(f"buffer {key!r} is missing at load")
        elif have.shape != want.shape:
            wrong.append(f"buffer {key!r} has shape {tuple(have.shape)} at load, eager {tuple(want.shape)}")
        elif not have.to(want.dtype).equal(want):
            wrong.append(f"buffer {key!r} starts as {have}, eager {want}")
    return wrong
