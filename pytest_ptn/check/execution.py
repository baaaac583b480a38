"""Running a call sequence on a loaded program, as the scenario tests, the fuzz and check_program all do:
each call's methods loaded as a load schedule says, its inputs copied, what it gave kept
(check.values.Ran)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from pytest_ptn.check.values import Ran
from pytest_ptn.programs.source import copied

if TYPE_CHECKING:
    from pytest_ptn.backend import EagerCall, Loaded

Call = tuple[str, tuple[Any, ...]]


def flat(value: Any) -> list[torch.Tensor]:
    """The tensors of a (nested) output, in order, as the runtime returns them."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for v in value for t in flat(v)]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in flat(v)]
    return []


def run(
    loaded: Loaded,
    calls: Sequence[EagerCall],
    loads: Sequence[Sequence[str]],
    state: bool,
    into: list[Ran],
    enter: Callable[[str], None] = lambda step: None,
) -> list[Ran]:
    """What ``loaded`` gives for each of ``calls``, the methods ``loads`` lists for a call loaded before it
    (LoadSchedule.loads), and its state view after each call where ``state``: appended to ``into`` call by
    call, so that where the backend raises, ``into`` holds what the calls before gave. ``enter`` is told each
    step first (crash isolation notes it)."""
    for call, to_load in zip(calls, loads, strict=True):
        for method in to_load:
            enter(f"loading {method}()")
            loaded.load_method(method)
        given = [copied(value) for value in call.inputs]
        enter(f"running {call.method}()")
        outputs = [t.clone() for t in loaded.run(call.method, given)]  # a runtime may reuse its memory
        shown = {k: t.clone() for k, t in loaded.state().items()} if state else None
        into.append(Ran(outputs, given, shown))
    return into
