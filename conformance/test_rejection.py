"""P6, P7, P8 and X1: programs the rules reject, and how the rejection reads."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pytest_ptn.backend import Capability
from pytest_ptn.harness import Case
from pytest_ptn.run.not_applicable import skip_not_applicable


def _rejection(case: Case) -> Exception | None:
    try:
        case.lower()
    except Exception as e:
        return e
    return None


def _must_reject(case: Case, what: str) -> None:
    error = _rejection(case)
    if error is None:
        pytest.fail(f"lowering accepted {what}; it must be rejected", pytrace=False)


@pytest.mark.P6
@pytest.mark.ptn_scenarios("P6")
def test_method_named_state_is_rejected(ptn_case: Case) -> None:
    _must_reject(ptn_case, "a method named 'state'")


@pytest.mark.P7
@pytest.mark.ptn_scenarios("P7")
def test_conflicting_state_is_rejected(ptn_case: Case) -> None:
    _must_reject(ptn_case, "a mutable key whose initial values differ between methods")


@pytest.mark.P8
@pytest.mark.ptn_scenarios("P8")
def test_final_name_collision_is_rejected(ptn_case: Case) -> None:
    _must_reject(ptn_case, "two (method, key) pairs with one final name")


@pytest.mark.X1
@pytest.mark.ptn_scenarios("reject")
def test_rejection_names_method_and_key(ptn_case: Case) -> None:
    error = _rejection(ptn_case)
    if error is None:
        if Capability.PACKAGE in ptn_case.backend.capabilities:
            pytest.fail(f"lowering accepted {ptn_case.scenario.name}; nothing to read", pytrace=False)
        skip_not_applicable(f"{ptn_case.backend.name} accepts {ptn_case.scenario.name}")
    message = str(error)
    missing = [name for name in ptn_case.scenario.names if name not in message]
    assert not missing, f"{type(error).__name__}: {message!r} does not name {missing}"


def _bad_calls(inputs: tuple[torch.Tensor, ...]) -> dict[str, tuple[Any, ...]]:
    """Calls the method was not exported for, each beside its first input: one input too many, one too
    few, a Python number for it, another dtype, other sizes, other ranks (most of these broadcast, so a
    backend that does not check its inputs computes a silently wrong answer from them)."""
    first, rest = inputs[0], inputs[1:]
    other = torch.float64 if first.dtype != torch.float64 else torch.float32
    bad = {
        "one input too many": (*inputs, first.clone()),
        "one input too few": inputs[:-1],
        "input 0 as a Python float": (1.0, *rest),
        f"input 0 as {other}": (first.to(other), *rest),
    }
    if first.dim() > 0:
        bad["input 0 with dimension 0 twice as long"] = (torch.cat([first, first]), *rest)
        bad["input 0 with its last dimension dropped"] = (first.select(-1, 0).clone(), *rest)
        if first.shape[0] > 1:
            bad["input 0 with dimension 0 of size 1"] = (first[:1].clone(), *rest)
    bad["input 0 with a leading dimension of 1"] = (first.unsqueeze(0), *rest)
    bad["input 0 with a trailing dimension of 1"] = (first.unsqueeze(-1), *rest)
    return bad


@pytest.mark.X1
@pytest.mark.ptn_scenarios("shared_weight")  # one valid program whose methods take a float tensor
def test_call_with_wrong_inputs_is_refused(ptn_case: Case) -> None:
    """A call whose inputs do not fit the method's exported signature (count, dtype, shape) is a rejection:
    an exception naming the method, never an answer computed from inputs the method does not take."""
    if Capability.EXECUTE not in ptn_case.backend.capabilities:
        skip_not_applicable(f"{ptn_case.backend.name} runs no method")
    call = next((c for c in ptn_case.eager() if c.inputs), None)
    if call is None:
        skip_not_applicable(f"no method of {ptn_case.scenario.name} takes an input")
    try:
        loaded = ptn_case.load()
        loaded.load_method(call.method)
    except (Exception, pytest.fail.Exception) as e:  # E2 reports a program that does not lower or load
        skip_not_applicable(f"{ptn_case.backend.name} could not load {ptn_case.scenario.name} ({e})")
    problems = []
    for what, inputs in _bad_calls(call.inputs).items():
        try:
            outputs = loaded.run(
                call.method, [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
            )
        except Exception as e:
            if call.method not in str(e):
                problems.append(f"{what}: {type(e).__name__}({str(e)[:200]!r}) does not name the method")
        else:
            shapes = [tuple(o.shape) for o in outputs if isinstance(o, torch.Tensor)]
            problems.append(f"{what}: accepted, returned outputs of shapes {shapes}")
    assert not problems, f"method {call.method!r} called with inputs it does not take: " + "; ".join(problems)
