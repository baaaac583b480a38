"""E rules on the user's program: each call against eager, and the state view against eager's buffers."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from pytest_ptn.backend import Loaded, one_line
from pytest_ptn.check.findings import Difference, Finding, Stage
from pytest_ptn.mechanisms import Step, raised
from pytest_ptn.programs.source import find_tensor, widened
from pytest_ptn.schedule import LoadSchedule

if TYPE_CHECKING:
    from pytest_ptn.check.alone import CallAlone

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


@dataclass(frozen=True)
class Compared:
    """A value of one call that differs from eager's, and where it stands, so that it can be set beside the
    same value of the method alone (pytest_ptn.check.alone)."""

    finding: Finding
    have: torch.Tensor
    want: torch.Tensor
    wide: torch.Tensor | None
    where: int | str
    """An output's or input's position (``finding.detail`` says which), or a buffer's key."""

    def of(self, alone: CallAlone) -> torch.Tensor | None:
        """The same value in what the method alone gave, or None."""
        if isinstance(self.where, str):
            return alone.state_after.get(self.where)
        values = flat(alone.outputs) if self.finding.detail.startswith("output") else flat(alone.inputs_after)
        return values[self.where] if self.where < len(values) else None


def compare(
    rule: str,
    stage: Stage,
    what: str,
    method: str | None,
    call: int | None,
    have: Any,
    want: torch.Tensor,
    wide: torch.Tensor | None = None,
    computed_in: torch.dtype | None = None,
) -> Finding | None:
    """A finding when ``have`` is missing or differs from ``want`` (``wide``: eager's float64 counterpart
    for a reduced-precision program, pytest_ptn.instruments.comparison; ``computed_in``: a coarser dtype the
    backend declares it computes float32 in)."""
    if not isinstance(have, torch.Tensor):
        return Finding(rule, stage, f"{what} is missing", method, call)
    if have.shape != want.shape:
        return Finding(
            rule, stage, f"{what} has shape {tuple(have.shape)}, eager {tuple(want.shape)}", method, call
        )
    difference = Difference.between(have, want, wide, computed_in=_declared(computed_in, want))
    return None if difference is None else Finding(rule, stage, what, method, call, difference)


def _declared(computed_in: torch.dtype | None, want: torch.Tensor) -> torch.dtype | None:
    """The dtype a float32 value was computed in, by the backend's declaration; None for any other value."""
    return computed_in if want.dtype == torch.float32 else None


def run_calls(
    loaded: Loaded,
    eager: Mapping[str, torch.nn.Module],
    sequence: Sequence[Call],
    state_rules: Mapping[str, str] | None = None,
    wide: Mapping[str, torch.nn.Module] | None = None,
    schedule: LoadSchedule = LoadSchedule.UP_FRONT,
    computed_in: torch.dtype | None = None,
) -> tuple[list[Finding], list[list[torch.Tensor]], list[Compared]]:
    """Every call of ``sequence`` on ``loaded`` and on ``eager``, methods loaded as ``schedule`` says: the
    findings, what each call returned, and each value that differs from eager's.

    ``state_rules`` (buffer key -> E3 or E4) turns on the state view: buffers are compared with eager's at
    load (E5, exactly: nothing computed them yet) and after every call. ``wide``: the same program widened
    to float64, run beside eager to bound a reduced-precision program's rounding; where it raises, the rest
    is compared with the dtype's bound alone (stricter), and each differing value's finding says so."""
    findings: list[Finding] = []
    returned: list[list[torch.Tensor]] = []
    differing: list[Compared] = []
    unwidened = ""

    def check(
        rule: str, what: str, name: str, i: int, have: Any, want: torch.Tensor, ww: Any, where: Any
    ) -> None:
        found = compare(rule, Stage.COMPARE, what, name, i, have, want, ww, computed_in)
        if found is not None:
            findings.append(found)
            if found.difference is not None:  # a copy: a state view's tensor changes with later calls
                differing.append(Compared(found, have.detach().clone(), want.detach().clone(), ww, where))

    loads = schedule.loads(list(eager), [name for name, _ in sequence])
    if loads:
        try:
            for method in loads[0]:
                loaded.load_method(method)
        except Exception as e:
            return [Finding("E2", Stage.LOAD, f"loading failed: {one_line(e)}")], returned, differing
    if state_rules is not None:
        findings += _at_load(loaded, eager, list(state_rules))
    for i, ((name, args), to_load) in enumerate(zip(sequence, loads, strict=True)):
        eager_args, given = copy.deepcopy(args), copy.deepcopy(args)
        want = flat(eager[name](*eager_args))
        wide_args = widened(args, torch.float64)
        wide_want: list[Any] = [None] * len(want)
        if wide is not None:
            try:
                wide_want = flat(wide[name](*wide_args))
            except Exception as e:  # a program that cannot be widened is compared with the dtype's bound
                wide, unwidened = None, one_line(e)
        try:
            for method in to_load if i else ():
                loaded.load_method(method)
            have = loaded.run(name, list(given))
        except Exception as e:
            error = raised(Step.RUNNING, e, list(eager))  # its mechanism, until a replay explains it
            findings.append(
                Finding("E1", Stage.RUN, f"the call raised {one_line(e)}", name, i, mechanisms=(error,))
            )
            break
        returned.append(have)
        if len(have) != len(want):
            findings.append(_other_outputs(name, i, have, want, eager, state_rules))
        else:
            for j, (h, w, ww) in enumerate(zip(have, want, wide_want, strict=True)):
                check("E1", f"output {j}", name, i, h, w, ww, j)
        wide_after = flat(wide_args) if wide is not None else [None] * len(flat(eager_args))
        for j, (h, w, ww) in enumerate(zip(flat(given), flat(eager_args), wide_after, strict=True)):
            check("E1", f"input {j} after the call", name, i, h, w, ww, j)
        if state_rules is not None:
            state = loaded.state()
            for key, rule in state_rules.items():
                buffer = find_tensor(eager, key)
                if buffer is not None:
                    wide_buffer = find_tensor(wide, key) if wide is not None else None
                    what = f"buffer {key!r} after the call"
                    check(rule, what, name, i, state.get(key), buffer, wide_buffer, key)
    if unwidened:
        said = f" (bound of the dtype alone: eager's float64 rerun raised {unwidened})"
        told = {
            id(c.finding): dataclasses.replace(c.finding, detail=c.finding.detail + said) for c in differing
        }
        findings = [told.get(id(f), f) for f in findings]
        differing = [dataclasses.replace(c, finding=told[id(c.finding)]) for c in differing]
    return findings, returned, differing


def _other_outputs(
    name: str,
    i: int,
    have: list[Any],
    want: list[torch.Tensor],
    eager: Mapping[str, torch.nn.Module],
    state_keys: Iterable[str] | None,
) -> Finding:
    """The finding of call ``i`` returning another number of outputs than eager (check.values.other_outputs:
    a state write that came back as an output, where the backend shows state, ``state_keys``)."""
    from pytest_ptn.check.values import other_outputs

    after = {k: t for k in state_keys or () if (t := find_tensor(eager, k)) is not None}
    detail, how = other_outputs(name, have, len(want), after)
    return Finding("E1", Stage.COMPARE, detail, name, i, mechanisms=how)


def _at_load(loaded: Loaded, eager: Mapping[str, torch.nn.Module], keys: Sequence[str]) -> list[Finding]:
    """E5: each buffer of the state view, as loaded, is eager's (nothing computed it yet)."""
    state = loaded.state()
    findings = []
    for key in keys:
        want = find_tensor(eager, key)
        if want is not None:
            found = compare("E5", Stage.COMPARE, f"buffer {key!r} at load", None, None, state.get(key), want)
            findings += [] if found is None else [found]
    return findings
