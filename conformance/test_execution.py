"""E rules: every method of the program computes what the backend computes for it alone (its state explicit),
with state shared or private exactly as eager, under every load schedule a runner uses (``ptn_schedule``: all
methods up front, or each at its first call); A1: the method alone agrees with eager."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.export import Dim

from pytest_ptn.backend import Backend, Capability
from pytest_ptn.check.initial_state import initial_state_wrong
from pytest_ptn.check.values import Mismatch
from pytest_ptn.harness import Case, fail_on, spec_mismatches
from pytest_ptn.programs.user import NamedProgram
from pytest_ptn.run.not_applicable import skip_not_applicable
from pytest_ptn.schedule import LoadSchedule


def _what(case: Case, schedule: LoadSchedule, what: str) -> str:
    return f"{what} ({schedule.describe([c.method for c in case.eager()])})"


@pytest.mark.E1
@pytest.mark.ptn_scenarios("valid")
def test_each_method_matches_eager(ptn_case: Case, ptn_schedule: LoadSchedule) -> None:
    mismatches = ptn_case.run_sequence(ptn_case.load(), schedule=ptn_schedule)
    fail_on(mismatches, _what(ptn_case, ptn_schedule, "outputs differ from eager"))


@pytest.mark.E1
def test_calls_across_a_dynamic_range_match_eager(
    ptn_backend: Backend, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """E1 on a method exported over a dynamic dimension, which no catalogue scenario has: ``prefill`` takes
    a prompt of 2 to 16 rows and is called at both ends of that range and between them, ``decode`` one row,
    under every load schedule. A runtime that holds a method to the size it was traced at (5 rows) refuses
    the other sizes or computes them wrong.

    One dynamic method, as an LLM's prefill and decode have: two dynamic methods in one program, and a range
    from 1, are each the hazard of a catalogue scenario, where a backend's expectations can list what they
    find (measured: openvino returns the second dynamic method's calls at its range's upper size; native's
    interpreter refuses a range from 1 at 1, which torch's shape environment starts at 2)."""
    if Capability.EXECUTE not in ptn_backend.capabilities:
        skip_not_applicable(f"backend {ptn_backend.name} has no execute capability (E1)")
    if Capability.QUANTIZE in ptn_backend.capabilities:
        skip_not_applicable(
            f"{ptn_backend.name} quantizes each method, and this program is not quantization-friendly"
        )
    scenario, _ = _prompt_program().scenario()
    case = Case(ptn_backend, scenario, lambda name: tmp_path_factory.mktemp(name))
    fail_on(spec_mismatches(case), "outputs differ from eager")


PROMPT_ROWS = (2, 16)
"""``prefill``'s range of rows, both ends included."""
TRACED_ROWS = 5
WIDTH = 320
"""A row's size, a small model's hidden size: past 256, where sizes compared by identity rather than value
differ (CPython keeps one object for each smaller int)."""


class _Prompt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(-1, 1, WIDTH))
        self.scale = nn.Parameter(torch.linspace(0.5, 2, WIDTH))

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.weight


class _Method(nn.Module):
    def __init__(self, model: nn.Module, name: str) -> None:
        super().__init__()
        self.model, self.name = model, name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.model, self.name)(x)


def _prompt_program() -> NamedProgram:
    """``_Prompt``'s methods, ``prefill`` exported with its rows dynamic and called at its range's ends and
    middle, then ``decode`` on one row."""
    model = _Prompt()
    low, high = PROMPT_ROWS
    prompt = torch.linspace(-2, 2, TRACED_ROWS * WIDTH).reshape(TRACED_ROWS, WIDTH)
    token = torch.ones(1, WIDTH)
    rows = Dim("rows", min=low, max=high)
    exported = {
        "prefill": torch.export.export(
            _Method(model, "prefill"), (prompt,), dynamic_shapes=({0: rows},), strict=False
        ),
        "decode": torch.export.export(_Method(model, "decode"), (token,), strict=False),
    }
    generator = torch.Generator().manual_seed(67)
    calls = [
        (name, (torch.randn(n, WIDTH, generator=generator),))
        for name, n in [("prefill", low), ("decode", 1), ("prefill", (low + high) // 2), ("prefill", high)]
    ]
    return NamedProgram("prompt_rows", exported, {"prefill": (prompt,), "decode": (token,)}, calls=calls)


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
        mismatches = ptn_case.run_sequence(ptn_case.load(), schedule=ptn_schedule, state=True)
        fail_on(mismatches, _what(ptn_case, ptn_schedule, "shared state differs from eager"))
    else:
        mismatches = ptn_case.run_sequence(ptn_case.load(), schedule=ptn_schedule)
        fail_on(mismatches, _what(ptn_case, ptn_schedule, "outputs reading shared state differ from eager"))


@pytest.mark.E4
@pytest.mark.ptn_scenarios("private_state")
def test_private_state_stays_private(ptn_case: Case, ptn_schedule: LoadSchedule) -> None:
    if Capability.STATE in ptn_case.backend.capabilities:
        mismatches = ptn_case.run_sequence(ptn_case.load(), schedule=ptn_schedule, state=True)
        fail_on(mismatches, _what(ptn_case, ptn_schedule, "private state changed by another method"))
    first, second = ptn_case.load(), ptn_case.load()
    mismatches = ptn_case.run_sequence(first, schedule=ptn_schedule)
    fail_on(mismatches, _what(ptn_case, ptn_schedule, "first loaded copy differs from eager"))
    mismatches = ptn_case.run_sequence(second, schedule=ptn_schedule)
    fail_on(mismatches, _what(ptn_case, ptn_schedule, "second loaded copy sees the first copy's state"))


@pytest.mark.E5
@pytest.mark.ptn_scenarios("buffers")
def test_buffers_start_from_eager_values(ptn_case: Case, ptn_schedule: LoadSchedule) -> None:
    """Buffers as loaded equal eager's exactly (no arithmetic touched them): every buffer some method
    writes, and every other one the state view shows; each method's first call on a fresh copy, the other
    methods loaded before it or not as the schedule says, computes what the method alone computes from
    eager's initial state."""
    mismatches = []
    if Capability.STATE in ptn_case.backend.capabilities:
        loaded = ptn_case.load()
        if ptn_schedule is LoadSchedule.UP_FRONT:
            for method in ptn_case.program.method_names:
                loaded.load_method(method)
        program = ptn_case.program
        wrong = initial_state_wrong(loaded.state(), program.buffer_fqns(), program.state_fqns())
        mismatches += [Mismatch(0, "(load)", line) for line in wrong]
    for method in ptn_case.program.method_names:
        first_call = ptn_case.program.run_eager((method,))
        mismatches += ptn_case.run_sequence(ptn_case.load(), first_call, ptn_schedule)
    fail_on(mismatches, f"initial values differ from eager ({ptn_schedule.describe(())})")


@pytest.mark.A1
@pytest.mark.ptn_scenarios("valid")
def test_each_method_agrees_with_eager(ptn_case: Case) -> None:
    """Where the program's results differ from eager's, the method alone differs too: the backend's
    arithmetic (its kernels, the precision it computes in), told with max abs, max rel and SNR. A SHOULD:
    isolation is E1's; kernels that compute differently from eager are reported, never a failed run."""
    fail_on(ptn_case.accuracy(), "the method alone differs from eager")
