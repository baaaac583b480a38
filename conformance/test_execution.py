"""E rules: every method computes what eager computes, with state shared or private exactly as eager, under
every load schedule a runner uses (``ptn_schedule``: all methods up front, or each at its first call)."""

from __future__ import annotations

import pytest

from pytest_ptn.backend import Capability
from pytest_ptn.comparison import equal
from pytest_ptn.harness import Case, Mismatch, fail_on
from pytest_ptn.schedule import LoadSchedule


def _state_mismatches(case: Case, schedule: LoadSchedule) -> list[Mismatch]:
    """Run the sequence comparing the state view with eager after every call."""
    loaded = case.load()
    calls = case.eager()
    loads = schedule.loads(case.program.method_names, [c.method for c in calls])
    mismatches = []
    for i, (call, to_load) in enumerate(zip(calls, loads, strict=True)):
        for method in to_load:
            loaded.load_method(method)
        mismatches += [Mismatch(i, m.method, m.detail) for m in case.run_sequence(loaded, [call])]
        state = loaded.state()
        for key, want in call.state_after.items():
            have = state.get(key)
            if have is None or not equal(have, want, call.widened(key), case.tolerance):
                shown = None if have is None else [round(v, 4) for v in have.reshape(-1).tolist()[:8]]
                mismatches.append(
                    Mismatch(
                        i, call.method, f"buffer {key!r} is {shown}, eager {want.reshape(-1).tolist()[:8]}"
                    )
                )
    return mismatches


def _what(case: Case, schedule: LoadSchedule, what: str) -> str:
    return f"{what} ({schedule.describe([c.method for c in case.eager()])})"


@pytest.mark.E1
@pytest.mark.ptn_scenarios("valid")
def test_each_method_matches_eager(ptn_case: Case, ptn_schedule: LoadSchedule) -> None:
    mismatches = ptn_case.run_sequence(ptn_case.load(), schedule=ptn_schedule)
    fail_on(mismatches, _what(ptn_case, ptn_schedule, "outputs differ from eager"))


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
def test_shared_state_is_seen_by_every_method(ptn_case: Case, ptn_schedule: LoadSchedule) -> None:
    if Capability.STATE in ptn_case.backend.capabilities:
        mismatches = _state_mismatches(ptn_case, ptn_schedule)
        fail_on(mismatches, _what(ptn_case, ptn_schedule, "shared state differs from eager"))
    else:
        mismatches = ptn_case.run_sequence(ptn_case.load(), schedule=ptn_schedule)
        fail_on(mismatches, _what(ptn_case, ptn_schedule, "outputs reading shared state differ from eager"))


@pytest.mark.E4
@pytest.mark.ptn_scenarios("private_state")
def test_private_state_stays_private(ptn_case: Case, ptn_schedule: LoadSchedule) -> None:
    if Capability.STATE in ptn_case.backend.capabilities:
        mismatches = _state_mismatches(ptn_case, ptn_schedule)
        fail_on(mismatches, _what(ptn_case, ptn_schedule, "private state changed by another method"))
    first, second = ptn_case.load(), ptn_case.load()
    mismatches = ptn_case.run_sequence(first, schedule=ptn_schedule)
    fail_on(mismatches, _what(ptn_case, ptn_schedule, "first loaded copy differs from eager"))
    mismatches = ptn_case.run_sequence(second, schedule=ptn_schedule)
    fail_on(mismatches, _what(ptn_case, ptn_schedule, "second loaded copy sees the first copy's state"))


@pytest.mark.E5
@pytest.mark.ptn_scenarios("buffers")
def test_buffers_start_from_eager_values(ptn_case: Case, ptn_schedule: LoadSchedule) -> None:
    """Buffers as loaded equal eager's exactly (no arithmetic touched them); each method's first call on a
    fresh copy, the other methods loaded before it or not as the schedule says, matches eager."""
    mismatches = []
    if Capability.STATE in ptn_case.backend.capabilities:
        loaded = ptn_case.load()
        if ptn_schedule is LoadSchedule.UP_FRONT:
            for method in ptn_case.program.method_names:
                loaded.load_method(method)
        state = loaded.state()
        for key, want in ptn_case.program.state_fqns().items():
            have = state.get(key)
            if have is None or not have.to(want.dtype).equal(want):
                mismatches.append(Mismatch(0, "(load)", f"buffer {key!r} starts as {have}, eager {want}"))
    for method in ptn_case.program.method_names:
        first_call = ptn_case.program.run_eager((method,))
        mismatches += ptn_case.run_sequence(ptn_case.load(), first_call, ptn_schedule)
    fail_on(mismatches, f"initial values differ from eager ({ptn_schedule.describe(())})")
