"""Say whose data a wrong output read: replay the program with one constant or buffer bound the way a
faulty loader binds it, and see whether that gives the backend's values."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Mapping, Sequence

import torch

from pytest_ptn.check.execution import Call, flat
from pytest_ptn.check.findings import Difference, Finding, Stage
from pytest_ptn.instruments.content import digest
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
        dataclasses.replace(f, explanation=explained[f.call])
        if f.call in explained and f.rule == "E1" and f.stage == Stage.COMPARE
        else f
        for f in findings
    ]


Replays = list[tuple[str, list[list[torch.Tensor]]]]
"""What each faulty binding gives on every call of a sequence: (what it is, each call's outputs)."""


def explanations(
    replays: Replays, returned: Sequence[Sequence[torch.Tensor]], wrong: Mapping[int, str]
) -> dict[int, str]:
    """For each wrong call (``wrong``: call -> its method) whose outputs, ``returned`` by the backend, one
    faulty binding accounts for: what that binding gives ("what method 'prefill''s 'weight' would give")."""
    explained: dict[int, str] = {}
    for label, replayed in replays:
        for call in wrong:
            if call not in explained and _same(list(returned[call]), replayed[call]):
                explained[call] = label
    return explained


def faulty_replays(
    fresh: Mapping[str, torch.export.ExportedProgram], mutable: set[str], sequence: Sequence[Call]
) -> Replays:
    """The sequence replayed on the program bound each faulty way a loader binds (a binding the program
    cannot run with explains nothing): what a backend's wrong outputs are matched against. ``fresh``: new
    exports (their eager modules are the base every binding copies), ``mutable``: the keys of the buffers
    some method writes. The exports need not be functional: a binding reads their constants, and the keys
    it binds are the eager modules' own."""
    base = exported_eager(fresh, mutable)
    constants = {m: constants_of(ep) for m, ep in fresh.items()}
    out = []
    for label, modules in _faulty_bindings(base, constants, mutable, {name for name, _ in sequence}):
        try:
            out.append((label, _replay(modules, sequence)))
        except Exception:
            continue
    return out


def _faulty_bindings(
    base: Modules, constants: Mapping[str, Mapping[str, ConstantUse]], mutable: set[str], methods: set[str]
) -> Iterator[tuple[str, Modules]]:
    """(what it would give, the program bound that way): another method's same-named constant, a private
    copy of shared state, two same-shape buffers in one memory, state that starts zero-filled (its initial
    value lost, as a non-persistent buffer's is when a lowering ships no data for it)."""
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
                    modules = copy.deepcopy(base)
                    set_tensor(modules[method], key, t.clone())
                    yield f"what method {other!r}'s {key!r} would give", modules
        for key in sorted(mutable & set(constants[method])):
            if any(key in theirs for other, theirs in constants.items() if other != method):
                modules = copy.deepcopy(base)
                own = find_tensor({method: modules[method]}, key)
                if own is not None:
                    set_tensor(modules[method], key, own.clone())
                    yield (
                        f"what a private copy of {key!r} would give (not seeing the other methods' writes)",
                        modules,
                    )
    buffers = sorted(mutable)
    for i, key in enumerate(buffers):
        for other in buffers[i + 1 :]:
            modules = copy.deepcopy(base)
            a, b = find_tensor(modules, key), find_tensor(modules, other)
            if a is not None and b is not None and a.shape == b.shape and a.dtype == b.dtype:
                for module in modules.values():
                    if find_tensor({"": module}, other) is not None:
                        set_tensor(module, other, a)
                yield f"what buffers {key!r} and {other!r} in one memory would give", modules
    for key in buffers:  # state only: a buffer no method writes is the method's own, alone or not
        modules = copy.deepcopy(base)
        zeroed = [
            t for t in (find_tensor({m: module}, key) for m, module in modules.items()) if t is not None
        ]
        if zeroed and any(bool(t.any()) for t in zeroed):
            with torch.no_grad():
                for t in zeroed:
                    t.zero_()
            yield f"what {key!r} starting zero-filled would give", modules


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
