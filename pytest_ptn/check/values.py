"""A run's values set against eager's: what a loaded program gave (``Ran``), each value that differs
(``Deviation``) under the one comparison a case has (``Comparison``: the backend's tolerance and the dtype it
computes float32 in), and the words a failure shows (``Mismatch``). Plain values in and out: the scenario
tests, the fuzz and ``check_spec`` judge every run with them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_ptn.mechanisms import Kind, Mechanism, Role

if TYPE_CHECKING:
    import torch

    from pytest_ptn.backend import EagerCall, ReducedPrecision
    from pytest_ptn.check.alone import CallAlone
    from pytest_ptn.instruments.comparison import Tolerance


@dataclass
class Mismatch:
    """One call whose result differs from the truth; ``str()`` is the line a failure shows."""

    call: int
    """Index in the call sequence."""
    method: str
    """The method called."""
    detail: str
    """What differs, in words, with the numbers."""
    mechanisms: tuple[Mechanism, ...] = ()
    """How the wrong value came about (pytest_ptn.mechanisms), as the checks found it; none found, it is
    unexplained at its call (the causes group tests by where nothing explains a value)."""
    buffer: str | None = None
    """The state it is about, for a buffer the state view lacks."""

    def __post_init__(self) -> None:
        if not self.mechanisms:
            self.mechanisms = (Mechanism(Kind.UNEXPLAINED, None, f"call #{self.call} {self.method}()"),)

    def __str__(self) -> str:
        return f"call #{self.call} {self.method}(): {self.detail}"


@dataclass
class Ran:
    """What a loaded program gave on one call."""

    outputs: list[torch.Tensor]
    inputs_after: list[torch.Tensor]
    state: dict[str, torch.Tensor] | None
    """The state view after the call, where it was asked for."""


@dataclass
class Deviation:
    """A value the backend gave that differs from eager's: an output, an input after the call or a buffer."""

    call: int
    kind: str
    """``output``, ``input`` or ``buffer``."""
    where: int | str
    """The output's or input's position, or the buffer's key."""
    have: torch.Tensor
    want: torch.Tensor
    wide: torch.Tensor | None

    @property
    def what(self) -> str:
        return f"buffer {self.where!r}" if self.kind == "buffer" else f"{self.kind} {self.where}"

    def of(self, alone: CallAlone) -> torch.Tensor | None:
        """The same value in what the method alone gave (None where it gave none)."""
        import torch

        if isinstance(self.where, str):
            return alone.state_after.get(self.where)
        values: list[object] = list(alone.outputs if self.kind == "output" else alone.inputs_after)
        value = values[self.where] if self.where < len(values) else None
        return value if isinstance(value, torch.Tensor) else None


@dataclass(frozen=True)
class Comparison:
    """How a case's values are compared (pytest_ptn.instruments.comparison): ``tolerance``, what a quantizing
    backend declares its results may differ by (None: the dtype's bound alone), and ``reduced``, the coarser
    dtype the backend computes float32 in on this machine, whose rounding steps a float32 value may show."""

    tolerance: Tolerance | None
    reduced: ReducedPrecision | None

    def computed_in(self, want: torch.Tensor) -> torch.dtype | None:
        """The coarser dtype the backend declares it computes ``want``'s float32 values in, or None."""
        import torch

        reduced = self.reduced
        return getattr(torch, reduced.dtype) if reduced is not None and want.dtype == torch.float32 else None

    def same(self, d: Deviation, truth: torch.Tensor) -> bool:
        """The program's value equals what the method alone gives (the same bound, eager's noise kept)."""
        from pytest_ptn.instruments.comparison import equal

        return equal(d.have, truth, d.wide, None, self.computed_in(d.want), eager=d.want)

    def same_as_eager(self, d: Deviation, value: torch.Tensor) -> bool:
        from pytest_ptn.instruments.comparison import equal

        return equal(value, d.want, d.wide, self.tolerance, self.computed_in(d.want))

    def deviations(self, calls: list[EagerCall], ran: list[Ran]) -> tuple[list[Deviation], list[Mismatch]]:
        """Every value that differs from eager's, and the mismatches no truth can excuse (a missing output or
        buffer, another number of outputs)."""
        import torch

        deviations, mismatches = [], []
        for i, (call, got) in enumerate(zip(calls, ran, strict=True)):
            if len(got.outputs) != len(call.outputs):
                detail, how = other_outputs(call.method, got.outputs, len(call.outputs), call.state_after)
                mismatches.append(Mismatch(i, call.method, detail, how))
                continue
            outputs = zip(call.outputs, got.outputs, call.output_bounds(), strict=True)
            wide_after = call.wide.inputs_after if call.wide is not None else (None,) * len(call.inputs_after)
            inputs = zip(call.inputs_after, got.inputs_after, wide_after, strict=True)
            values: list[tuple[str, int | str, torch.Tensor, torch.Tensor, torch.Tensor | None]] = [
                *(("output", j, h, w, b) for j, (w, h, b) in enumerate(outputs)),
                *(("input", j, h, w, b) for j, (w, h, b) in enumerate(inputs)),
            ]
            if got.state is not None:
                for key, want in call.state_after.items():
                    have = got.state.get(key)
                    if have is None:
                        missing = f"buffer {key!r} is missing from the state"
                        mismatches.append(Mismatch(i, call.method, missing, buffer=key))
                    else:
                        values.append(("buffer", key, have, want, call.widened(key)))
            for kind, where, have, want, wide in values:
                if not isinstance(want, torch.Tensor):
                    continue  # an input no call can change (an int given as it is)
                deviation = Deviation(i, kind, where, have, want, wide)
                if not self.same_as_eager(deviation, have):
                    deviations.append(deviation)
        return deviations, mismatches


def same_outputs(ours: Sequence[torch.Tensor], theirs: Sequence[torch.Tensor]) -> bool:
    """Two runs' outputs of one call are the same (pytest_ptn.instruments.comparison.equal)."""
    from pytest_ptn.instruments.comparison import equal

    return len(ours) == len(theirs) and all(map(equal, ours, theirs))


def differing_calls(
    ours: Sequence[Sequence[torch.Tensor]], theirs: Sequence[Sequence[torch.Tensor]]
) -> set[int]:
    """The calls whose outputs in one run (``ours``) another run of the same calls (``theirs``) does not
    give: where a call of ``theirs`` is missing (it raised before), it gave nothing alike."""
    return {i for i, outputs in enumerate(ours) if i >= len(theirs) or not same_outputs(outputs, theirs[i])}


def other_outputs(
    method: str, have: Sequence[object], eager_gives: int, state_after: Mapping[str, torch.Tensor]
) -> tuple[str, tuple[Mechanism, ...]]:
    """The words for a call of ``method`` that returned ``have``, another number of outputs than eager's,
    and its mechanism where the first extra ones hold what state holds after the call (``state_after``, by
    key): a write that came back as an output and never reached the state (``write-returned:state``)."""
    detail = f"{len(have)} outputs, eager gives {eager_gives}"
    returned = _writes_returned(have[: len(have) - eager_gives], state_after)
    if not returned:
        return detail, ()
    detail += f": the first {'are' if len(returned) > 1 else 'is'} {', '.join(returned)}"
    return detail, (Mechanism(Kind.WRITE_RETURNED, Role.STATE, f"{method}() returns {returned[0]}"),)


def _writes_returned(extra: Sequence[object], state_after: Mapping[str, torch.Tensor]) -> list[str]:
    """The words for each of ``extra`` (the outputs a backend returned beyond eager's, which a lowering puts
    first, where buffer mutations go) if each holds a state's value after the call, as eager has it
    (``state_after``, by key: "what 'step_state' holds after the call"); else none."""
    import torch

    from pytest_ptn.check.findings import Difference

    said = []
    for value in extra:
        key = next(
            (
                k
                for k, want in state_after.items()
                if isinstance(value, torch.Tensor)
                and value.shape == want.shape
                and Difference.between(value, want) is None
            ),
            None,
        )
        if key is None:
            return []
        said.append(f"what {key!r} holds after the call")
    return said


def describe(
    names: list[str],
    want: torch.Tensor,
    have: torch.Tensor,
    ok: torch.Tensor | None,
    owners: dict[str, list[tuple[str, float]]],
    computed_in: torch.dtype | None,
) -> tuple[str, str]:
    """What differs, value by value where each value reads one name, and the first value that is what
    another method's same-named tensor gives ("method 'prefill''s 'w'"; "" when none is); ``ok`` the
    elementwise comparison (None when the shapes differ).
    ``computed_in``: the dtype the backend computed this float32 output in, whose rounding a value read from
    another method's tensor may show."""
    if ok is None:
        return f"output shape {tuple(have.shape)}, eager {tuple(want.shape)}", ""
    from pytest_ptn.instruments.comparison import allowed, difference

    parts, read = [], ""
    bound = allowed(want, computed_in=computed_in).reshape(-1)
    for k, name in enumerate(names[: want.numel()]):
        if not bool(ok.reshape(-1)[k]):
            w, h = float(want.reshape(-1)[k]), float(have.reshape(-1)[k])
            slack = float(bound[k])  # the rounding a correct computation of the same value may show
            whose = [m for m, v in owners.get(name, []) if abs(v - h) <= max(slack, 1e-4 * max(1.0, abs(v)))]
            owner = f"method {whose[0]!r}'s {name!r}" if whose else ""
            seen = f": it read {owner}" if owner else ""
            read = read or owner
            parts.append(f"value {k} (reads {name!r}) is {h:.6g}, eager {w:.6g}{seen}")
    if parts:
        return "; ".join(parts), read
    wrong = (~ok).nonzero().tolist()
    if not wrong:
        return f"output {fmt(have)}, eager {fmt(want)}", read
    error = float(difference(have, want).max())
    shown = ", ".join(
        f"{i} is {float(have[tuple(i)]):.6g} (eager {float(want[tuple(i)]):.6g})" for i in wrong[:3]
    )
    return f"{len(wrong)} of {want.numel()} values differ, max abs error {error:.3g}: {shown}", read


def fmt(t: torch.Tensor) -> str:
    """A tensor's first values, as a failure line shows them."""
    return str([round(v, 4) for v in t.reshape(-1).tolist()[:8]])
