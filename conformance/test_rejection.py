"""P6, P7, P8 and X1: programs the rules reject, and how the rejection reads."""

from __future__ import annotations

import pytest

from pytest_ptn.backend import Capability
from pytest_ptn.harness import Case
from pytest_ptn.ruleset import not_applicable


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
        pytest.skip(not_applicable(f"{ptn_case.backend.name} accepts {ptn_case.scenario.name}"))
    message = str(error)
    missing = [name for name in ptn_case.scenario.names if name not in message]
    assert not missing, f"{type(error).__name__}: {message!r} does not name {missing}"
