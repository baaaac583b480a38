"""What a method accepts: each user input's dtype and sizes (the ranges its program declares), and why a
call does not fit, so the reference loader refuses such calls as the runtime does and every room below the
program catalogue can tell a refused call from a wrong result."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

DECLARED_RANGES = "pytest_ptn_range_constraints"
"""The key of a graph module's ``meta`` under which a lowering keeps its program's range constraints."""


@dataclass(frozen=True)
class InputMeta:
    """What one user input of an exported method must be: its dtype, and each dimension's size, or the
    (low, high) range of a dynamic one (high None: unbounded)."""

    dtype: torch.dtype
    dims: tuple[int | tuple[int, int | None], ...]

    @classmethod
    def of(cls, val: torch.Tensor, ranges: Mapping[Any, Any] | None = None) -> InputMeta:
        """From a placeholder's fake value; a dynamic size's range from ``ranges`` (an ExportedProgram's
        range constraints: what the program declares) or else from the shape environment that traced it,
        which starts a size declared from 0 or 1 at 2 (torch's 0/1 specialization hint), so a graph lowered
        from a program keeps its ranges (DECLARED_RANGES)."""
        dims: list[int | tuple[int, int | None]] = []
        for size in val.shape:
            if isinstance(size, int):
                dims.append(size)
                continue
            expr = size.node.expr
            bounds = ranges.get(expr) if ranges is not None else size.node.shape_env.var_to_range.get(expr)
            low = int(bounds.lower) if bounds is not None else 0
            high = int(bounds.upper) if bounds is not None and bounds.upper.is_finite else None
            dims.append((low, high))
        return cls(val.dtype, tuple(dims))

    def refusal(self, value: Any) -> str | None:
        """Why ``value`` cannot be this input (as the runtime refuses it), or None."""
        if not isinstance(value, torch.Tensor):
            return f"a tensor, not {type(value).__name__}"
        shape = tuple(value.shape)
        want = "(" + ", ".join(str(d) if isinstance(d, int) else f"{d[0]}..{d[1] or ''}" for d in self.dims)
        want += ",)" if len(self.dims) == 1 else ")"
        wrong = len(shape) != len(self.dims) or any(
            (size != d) if isinstance(d, int) else not (d[0] <= size and (d[1] is None or size <= d[1]))
            for size, d in zip(shape, self.dims, strict=False)
        )
        if wrong or value.dtype != self.dtype:
            return f"shape {want} {self.dtype}, not {shape} {value.dtype}"
        return None


def input_metas(ep: ExportedProgram) -> list[InputMeta]:
    """The user inputs an exported method admits, in order, from its placeholders and range constraints."""
    user = {s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    vals = [node.meta.get("val") for node in ep.graph.find_nodes(op="placeholder") if node.name in user]
    return [InputMeta.of(v, ep.range_constraints) for v in vals if isinstance(v, torch.Tensor)]


class CallRefused(ValueError):
    """A call whose inputs the method does not admit (another shape or dtype than it was exported for)."""


def call_refusal(method: str, metas: list[InputMeta], args: Any) -> str | None:
    """Why method ``method`` cannot be called with ``args`` (a tensor that does not fit the exported input),
    or None: the reference loader refuses such calls as the runtime does."""
    args = list(args)
    if len(args) != len(metas):
        return f"method {method!r} takes {len(metas)} inputs, not {len(args)}"
    for i, (meta, value) in enumerate(zip(metas, args, strict=True)):
        reason = meta.refusal(value)
        if reason is not None:
            return f"method {method!r} takes input {i} as {reason}"
    return None
