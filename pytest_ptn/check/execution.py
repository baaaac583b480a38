"""E rules on the user's program: each call against eager, and the state view against eager's buffers."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from pytest_ptn.backend import Loaded, one_line
from pytest_ptn.check.findings import Difference, Finding, Stage
from pytest_ptn.programs.source import find_tensor, widened
from pytest_ptn.schedule import LoadSchedule

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


def compare(
    rule: str,
    stage: Stage,
    what: str,
    method: str | None,
    call: int | None,
    have: Any,
    want: torch.Tensor,
    wide: torch.Tensor | None = None,
) -> Finding | None:
    """A finding when ``have`` is missing or differs from ``want`` (``wide``: eager's float64 counterpart
    for a reduced-precision program, pytest_ptn.comparison)."""
    if not isinstance(have, torch.Tensor):
        return Finding(rule, stage, f"{what} is missing", method, call)
    if have.shape != want.shape:
        return Finding(
            rule, stage, f"{what} has shape {tuple(have.shape)}, eager {tuple(want.shape)}", method, call
        )
    difference = Difference.between(have, want, wide)
    return None if difference is None else Finding(rule, stage, what, method, call, difference)


def run_calls(
    loaded: Loaded,
    eager: Mapping[str, torch.nn.Module],
    sequence: Sequence[Call],
    state_rules: Mapping[str, str] | None = None,
    wide: Mapping[str, torch.nn.Module] | None = None,
    schedule: LoadSchedule = LoadSchedule.UP_FRONT,
) -> tuple[list[Finding], list[list[torch.Tensor]]]:
    """Every call of ``sequence`` on ``loaded`` and on ``eager``, methods loaded as ``schedule`` says: the
    findings, and what each call returned.

    ``state_rules`` (buffer key -> E3 or E4) turns on the state view: buffers are compared with eager's at
    load (E5, exactly: nothing computed them yet) and after every call. ``wide``: the same program widened
    to float64, run beside eager to bound a reduced-precision program's rounding."""
    findings: list[Finding] = []
    returned: list[list[torch.Tensor]] = []
    loads = schedule.loads(list(eager), [name for name, _ in sequence])
    if loads:
        try:
            for method in loads[0]:
                loaded.load_method(method)
        except Exception as e:
            return [Finding("E2", Stage.LOAD, f"loading failed: {one_line(e)}")], returned
    if state_rules is not None:
        findings += _state(loaded, eager, None, state_rules, "E5", None, None)
    for i, ((name, args), to_load) in enumerate(zip(sequence, loads, strict=True)):
        eager_args, given = copy.deepcopy(args), copy.deepcopy(args)
        want = flat(eager[name](*eager_args))
        wide_args = widened(args, torch.float64)
        wide_want = flat(wide[name](*wide_args)) if wide is not None else [None] * len(want)
        try:
            for method in to_load if i else ():
                loaded.load_method(method)
            have = loaded.run(name, list(given))
        except Exception as e:
            findings.append(Finding("E1", Stage.RUN, f"the call raised {one_line(e)}", name, i))
            break
        returned.append(have)
        if len(have) != len(want):
            findings.append(
                Finding("E1", Stage.COMPARE, f"{len(have)} outputs, eager gives {len(want)}", name, i)
            )
        else:
            for j, (h, w, ww) in enumerate(zip(have, want, wide_want, strict=True)):
                findings += _some(compare("E1", Stage.COMPARE, f"output {j}", name, i, h, w, ww))
        wide_after = flat(wide_args) if wide is not None else [None] * len(flat(eager_args))
        for j, (h, w, ww) in enumerate(zip(flat(given), flat(eager_args), wide_after, strict=True)):
            findings += _some(compare("E1", Stage.COMPARE, f"input {j} after the call", name, i, h, w, ww))
        if state_rules is not None:
            findings += _state(loaded, eager, wide, state_rules, None, name, i)
    return findings, returned


def _state(
    loaded: Loaded,
    eager: Mapping[str, torch.nn.Module],
    wide: Mapping[str, torch.nn.Module] | None,
    rules: Mapping[str, str],
    rule: str | None,
    method: str | None,
    call: int | None,
) -> list[Finding]:
    state = loaded.state()
    findings = []
    for key, key_rule in rules.items():
        want = find_tensor(eager, key)
        if want is not None:
            what = f"buffer {key!r} {'at load' if call is None else 'after the call'}"
            wide_want = find_tensor(wide, key) if wide is not None and call is not None else None
            findings += _some(
                compare(rule or key_rule, Stage.COMPARE, what, method, call, state.get(key), want, wide_want)
            )
    return findings


def _some(finding: Finding | None) -> list[Finding]:
    return [] if finding is None else [finding]
