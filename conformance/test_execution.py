"""E rules: every method computes what eager computes, with state shared or private exactly as eager."""

from __future__ import annotations

import pytest

from pytest_ptn.backend import Capability
from pytest_ptn.harness import Case, Mismatch, fail_on


def _state_mismatches(case: Case, keys: set[str] | None = None) -> list[Mismatch]:
    """Run the sequence comparing the state view with eager after every call."""
    loaded = case.load()
    mismatches = []
    for i, call in enumerate(case.eager()):
        mismatches += [Mismatch(i, m.method, m.detail) for m in case.run_sequence(loaded, [call])]
        state = loaded.state()
        for key, want in call.state_after.items():
            if keys is not None and key not in keys:
                continue
            have = state.get(key)
            if have is None or have.shape != want.shape or not have.to(want.dtype).allclose(want):
                shown = None if have is None else [round(v, 4) for v in have.reshape(-1).tolist()[:8]]
                mismatches.append(
                    Mismatch(
                        i, call.method, f"buffer {key!r} is {shown}, eager {want.reshape(-1).tolist()[:8]}"
                    )
                )
    return mismatches


@pytest.mark.E1
@pytest.mark.ptn_scenarios("valid")
def test_each_method_matches_eager(ptn_case: Case) -> None:
    fail_on(ptn_case.run_sequence(ptn_case.load()), "outputs differ from eager")


@pytest.mark.E2
@pytest.mark.ptn_scenarios("valid")
def test_valid_program_lowers_and_loads(ptn_case: Case) -> None:
    loaded = ptn_case.load()
    try:
        for method in ptn_case.program.method_names:
            loaded.load_method(method)
    except Exception as e:
        pytest.fail(f"loading failed: {type(e).__name__}: {e}", pytrace=False)


@pytest.mark.E3
@pytest.mark.ptn_scenarios("shared_state")
def test_shared_state_is_seen_by_every_method(ptn_case: Case) -> None:
    if Capability.STATE in ptn_case.backend.capabilities:
        fail_on(_state_mismatches(ptn_case), "shared state differs from eager")
    else:
        fail_on(ptn_case.run_sequence(ptn_case.load()), "outputs reading shared state differ from eager")


@pytest.mark.E4
@pytest.mark.ptn_scenarios("private_state")
def test_private_state_stays_private(ptn_case: Case) -> None:
    if Capability.STATE in ptn_case.backend.capabilities:
        fail_on(_state_mismatches(ptn_case), "private state changed by another method")
    first, second = ptn_case.load(), ptn_case.load()
    fail_on(ptn_case.run_sequence(first), "first loaded copy differs from eager")
    fail_on(ptn_case.run_sequence(second), "second loaded copy sees the first copy's state")


@pytest.mark.E5
@pytest.mark.ptn_scenarios("buffers")
def test_buffers_start_from_eager_values(ptn_case: Case) -> None:
    mismatches = []
    if Capability.STATE in ptn_case.backend.capabilities:
        state = ptn_case.load().state()
        for key, want in ptn_case.program.state_fqns().items():
            have = state.get(key)
            if have is None or not have.to(want.dtype).equal(want):
                mismatches.append(Mismatch(0, "(load)", f"buffer {key!r} starts as {have}, eager {want}"))
    for method in ptn_case.program.method_names:
        first_call = ptn_case.program.run_eager((method,))
        mismatches += ptn_case.run_sequence(ptn_case.load(), first_call)
    fail_on(mismatches, "initial values differ from eager")
