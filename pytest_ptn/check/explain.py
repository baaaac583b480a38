"""Say whose data a wrong output read: replay the program with one constant or buffer bound the way a
faulty loader binds it (or two such faults at once), and see whether that gives the backend's values: the
replay that does names the mechanisms (pytest_ptn.mechanisms)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import torch

from pytest_ptn.check.execution import Call, flat
from pytest_ptn.check.findings import Difference, Finding, Stage
from pytest_ptn.instruments.content import digest
from pytest_ptn.mechanisms import Kind, Mechanism, Role
from pytest_ptn.programs.exported import constants_of, mutable_keys
from pytest_ptn.programs.source import UserProgram, exported_eager, find_tensor, set_tensor
from pytest_ptn.reference.planner import ConstantUse

Modules = dict[str, torch.nn.Module]


def explain(
    findings: list[Finding],
    returned: list[list[torch.Tensor]],
    program: UserProgram,
    sequence: Sequence[Call],
) -> list[Finding]:
    """``findings``, each wrong call output that one faulty binding accounts for saying so."""
    wrong: dict[int, str] = {
        f.call: f.method
        for f in findings
        if f.rule == "E1"
        and f.stage == Stage.COMPARE
        and f.call is not None
        and f.method is not None
        and f.call < len(returned)
    }
    if not wrong:
        return findings
    replays = faulty_replays(program.export(), mutable_keys(program.inspected()), sequence)
    explained = explanations(replays, returned, wrong)
    return [
        dataclasses.replace(f, explanation=explained[f.call].label, mechanisms=explained[f.call].mechanisms)
        if f.call in explained and f.rule == "E1" and f.stage == Stage.COMPARE
        else f
        for f in findings
    ]


class Replay(NamedTuple):
    """What one faulty binding (or two at once) gives on every call of a sequence."""

    label: str
    """What it is: "what method 'prefill''s 'weight' would give"."""
    outputs: list[list[torch.Tensor]]
    mechanisms: tuple[Mechanism, ...]


Replays = list[Replay]


def explanations(
    replays: Replays, returned: Sequence[Sequence[torch.Tensor]], wrong: Mapping[int, str]
) -> dict[int, Replay]:
    """For each wrong call (``wrong``: call -> its method) whose outputs, ``returned`` by the backend, a
    faulty binding accounts for: the first replay that gives them (single faults before pairs)."""
    explained: dict[int, Replay] = {}
    for replay in replays:
        for call in wrong:
            if call not in explained and _same(list(returned[call]), replay.outputs[call]):
                explained[call] = replay
    return explained


def faulty_replays(
    fresh: Mapping[str, torch.export.ExportedProgram], mutable: set[str], sequence: Sequence[Call]
) -> Replays:
    """The sequence replayed on the program bound each faulty way a loader binds, one fault at a time, then
    two faults of state at once (state zero-filled that another buffer's writes also reach: the shared
    arena of a .pte whose buffers start from nothing); a binding the program cannot run with explains
    nothing. ``fresh``: new exports (their eager modules are the base every binding copies), ``mutable``:
    the keys of the buffers some method writes. The exports need not be functional: a binding reads their
    constants, and the keys it binds are the eager modules' own."""
    base = exported_eager(fresh, mutable)
    constants = {m: constants_of(ep) for m, ep in fresh.items()}
    buffers = {key for ep in fresh.values() for key in ep.graph_signature.buffers}
    faults = list(_faults(base, constants, mutable, buffers, {name for name, _ in sequence}))
    state_faults = [f for f in faults if f.mechanism.of == Role.STATE]
    pairs = [
        (first, second)
        for i, first in enumerate(state_faults)
        for second in state_faults[i + 1 :]
        if first.mechanism.kind != second.mechanism.kind
    ]
    out = []
    for chosen in [(f,) for f in faults] + sorted(pairs, key=lambda p: [_ORDER[f.mechanism.kind] for f in p]):
        modules = copy.deepcopy(base)
        if not all(fault.bind(modules) for fault in sorted(chosen, key=lambda f: _ORDER[f.mechanism.kind])):
            continue
        try:
            replayed = _replay(modules, sequence)
        except Exception:
            continue
        label = " and ".join(f.label for f in chosen)
        out.append(Replay(f"what {label} would give", replayed, tuple(f.mechanism for f in chosen)))
    return out


@dataclass(frozen=True)
class _Fault:
    """One faulty binding: its mechanism, its words, and how it binds a copy of the eager modules (False
    when the program has nothing to bind that way)."""

    mechanism: Mechanism
    label: str
    bind: Callable[[Modules], bool]


_ORDER = {Kind.BY_NAME: 0, Kind.PRIVATE_COPY: 1, Kind.ONE_MEMORY: 2, Kind.ZERO_FILLED: 3}
"""The order two faults bind in: memory first, then what it starts from (zero-filling one of two buffers
in one memory zero-fills both)."""


def _faults(
    base: Modules,
    constants: Mapping[str, Mapping[str, ConstantUse]],
    mutable: set[str],
    buffers: set[str],
    methods: set[str],
) -> Iterator[_Fault]:
    """Every faulty binding of the program: another method's same-named constant, a private copy of shared
    state, two buffers in one memory (the smaller at the start of the larger), state or a buffer no method
    writes that starts zero-filled (its initial value lost, as a non-persistent buffer's is when a lowering
    ships no data for it), and so does a constant whose name several methods hold (lost where lowering
    merged them)."""

    def role(key: str) -> Role:
        return Role.STATE if key in mutable else Role.BUFFER if key in buffers else Role.CONSTANT

    for method in sorted(methods):
        for key, use in constants[method].items():
            if key in mutable:
                continue
            for other, theirs in constants.items():
                t = theirs[key].tensor if other != method and key in theirs else None
                if (
                    t is not None
                    and _plain(t)
                    and _plain(use.tensor)
                    and (t.shape, t.dtype) == (use.tensor.shape, use.tensor.dtype)
                    and digest(t) != digest(use.tensor)
                ):
                    yield _Fault(
                        Mechanism(
                            Kind.BY_NAME, role(key), f"method {method!r} read method {other!r}'s {key!r}"
                        ),
                        f"method {other!r}'s {key!r}",
                        partial(_bind_other, method, key, t),
                    )
        for key in sorted(mutable & set(constants[method])):
            if any(key in theirs for other, theirs in constants.items() if other != method):
                yield _Fault(
                    Mechanism(Kind.PRIVATE_COPY, Role.STATE, f"method {method!r}'s copy of {key!r}"),
                    f"a private copy of {key!r} (not seeing the other methods' writes)",
                    partial(_bind_private, method, key),
                )
    states = sorted(mutable)
    for i, key in enumerate(states):
        for other in states[i + 1 :]:
            yield _Fault(
                Mechanism(Kind.ONE_MEMORY, Role.STATE, f"{key!r} and {other!r}"),
                f"buffers {key!r} and {other!r} in one memory",
                partial(_bind_one_memory, key, other),
            )
    held = [key for c in constants.values() for key in c if key not in mutable]
    colliding = sorted(key for key in set(held) if held.count(key) > 1 and key not in buffers)
    # every buffer (a non-persistent one ships no data where a lowering treats it as state); a constant only
    # where its name collides: lowering merged them
    for key in [*states, *sorted(buffers - mutable), *colliding]:
        yield _Fault(
            Mechanism(Kind.ZERO_FILLED, role(key), repr(key)),
            f"{key!r} starting zero-filled",
            partial(_bind_zeroed, key),
        )


def _bind_other(method: str, key: str, theirs: torch.Tensor, modules: Modules) -> bool:
    set_tensor(modules[method], key, theirs.clone())
    return True


def _bind_private(method: str, key: str, modules: Modules) -> bool:
    own = find_tensor({method: modules[method]}, key)
    if own is None:
        return False
    set_tensor(modules[method], key, own.clone())
    return True


def _bind_one_memory(key: str, other: str, modules: Modules) -> bool:
    """The smaller of the two buffers becomes the first elements of the larger (both planned at one offset),
    starting from the larger's values: its initial data, written over the smaller's."""
    a, b = find_tensor(modules, key), find_tensor(modules, other)
    if a is None or b is None or a.dtype != b.dtype or not (a.is_contiguous() and b.is_contiguous()):
        return False
    if a.numel() < b.numel():
        a, b, other = b, a, key
    inner = a if a.shape == b.shape else a.view(-1)[: b.numel()].view(b.shape)
    for module in modules.values():
        if find_tensor({"": module}, other) is not None:
            set_tensor(module, other, inner)
    return True


def _bind_zeroed(key: str, modules: Modules) -> bool:
    zeroed = [t for t in (find_tensor({m: module}, key) for m, module in modules.items()) if t is not None]
    if not zeroed or not all(_plain(t) for t in zeroed) or not any(bool(t.any()) for t in zeroed):
        return False
    with torch.no_grad():
        for t in zeroed:
            t.zero_()
    return True


def _plain(t: torch.Tensor) -> bool:
    """A tensor of PyTorch's own, not a subclass (torchao's Int8Tensor weight, which has no bytes of its
    own to compare, and whose binding a loader never sees: lowering flattens it into plain tensors)."""
    return type(t) in (torch.Tensor, torch.nn.Parameter)


def _replay(modules: Modules, sequence: Sequence[Call]) -> list[list[torch.Tensor]]:
    return [flat(modules[name](*copy.deepcopy(args))) for name, args in sequence]


def _same(have: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    return len(have) == len(want) and all(
        h.shape == w.shape and Difference.between(h, w) is None for h, w in zip(have, want, strict=True)
    )
