"""What a catalogue program's values read, from its spec alone: the names each output value reads, what it
would be with another method's same-named tensor, and what a wrong value may be a value of. A user
program has no spec (None): its values read anything, and a failure shows them as values."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pytest_ptn.mechanisms import Role
from pytest_ptn.spec import SHARED

if TYPE_CHECKING:
    import torch

    from pytest_ptn.check.values import Deviation
    from pytest_ptn.spec import ProgramSpec


def read_names(spec: ProgramSpec | None, method: str) -> list[str]:
    """What each output value of ``method`` reads; nothing for a user program (a failure shows values)."""
    if spec is None or spec.vectors:  # a vector's values read several
        return []
    m = spec.method(method)
    return [*m.reads, *(["cond"] if m.branch else [])] or ["x.sum()"]


def owners(
    spec: ProgramSpec | None, method: str, inputs: tuple[torch.Tensor, ...]
) -> dict[str, list[tuple[str, float]]]:
    """For each name ``method`` reads: what the value would be with another method's tensor of that name
    (so a failure can say whose weights a method read); known for catalogue programs only."""
    import torch

    from pytest_ptn.programs.build import values, weighted_sum

    if spec is None or spec.vectors:
        return {}
    dtype = getattr(torch, spec.dtype)
    xs = float(inputs[0].sum())
    out: dict[str, list[tuple[str, float]]] = {}
    for other in spec.methods:
        for c in other.constants:
            if other.name != method and c.family not in ("literal", "scalar"):
                value = float(weighted_sum(values(other.constants, c), dtype)) + xs
                out.setdefault(c.name, []).append((other.name, value))
    return out


def may_read(spec: ProgramSpec | None, method: str, d: Deviation) -> Callable[[str], bool]:
    """Whether deviation ``d`` of ``method`` can be a value of tensor ``key``: the buffer itself, or an
    output of a method the catalogue spec says reads it (any value of a user program's method)."""
    if d.kind == "buffer":
        return lambda key: key == d.where
    if spec is None:
        return lambda key: True
    reads = set(spec.method(method).reads)
    roots = [f"{root}." for root in (SHARED, spec.shared_alias) if root is not None]
    return lambda key: key in reads or any(key.startswith(r) and key[len(r) :] in reads for r in roots)


def role_of_read(spec: ProgramSpec | None, method: str) -> Role:
    """What sort of tensor a catalogue method's by-name read was of: a buffer if it reads one, else a
    constant (its values name what they read; a by-name read is never of state, which is shared)."""
    if spec is not None and any(c.family == "buffer" for c in spec.method(method).constants):
        return Role.BUFFER
    return Role.CONSTANT
