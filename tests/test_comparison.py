"""The dtype-fitted comparison (pytest_ptn.instruments.comparison): a correct bf16/fp16 backend's
rounding is equal, and every broken reference variant is still caught on the bf16 and fp16 scenarios."""

from __future__ import annotations

import pytest
import torch

from pytest_ptn.instruments.comparison import FLOOR, Tolerance, allowed, equal
from pytest_ptn.plugin import suite_path
from pytest_ptn.programs.build import Program
from pytest_ptn.programs.catalogue import BY_NAME, REDUCED_PRECISION_OF


def test_float32_keeps_the_v1_bound() -> None:
    want = torch.tensor([1.0, 100.0])
    assert equal(want + torch.tensor([FLOOR, 100 * FLOOR]), want)
    assert not equal(want + torch.tensor([3 * FLOOR, 0.0]), want)


def test_one_bf16_step_is_equal_and_three_are_not() -> None:
    want = torch.tensor([1.5, -3.0, 120.0], dtype=torch.bfloat16)
    step = torch.finfo(torch.bfloat16).eps * want.abs().to(torch.float64)
    assert equal(want.to(torch.float64) + step, want)
    assert not equal(want.to(torch.float64) + 3 * step, want)


def test_eager_noise_widens_the_tensor_it_was_measured_on() -> None:
    want = torch.tensor([1.0, 1.0], dtype=torch.bfloat16)
    wide = torch.tensor([1.05, 1.0], dtype=torch.float64)  # eager's own rounding moved element 0 by 0.05
    assert float(allowed(want, wide).min()) > 0.1
    assert equal(torch.tensor([1.0, 1.09]), want, wide)  # a correct backend's error falls elsewhere
    assert not equal(torch.tensor([1.0, 1.2]), want, wide)
    assert float(allowed(want).max()) < 0.02


def test_a_declared_tolerance_adds_to_the_bound_and_no_more() -> None:
    """A quantizing backend's Tolerance widens the float32 bound by atol + rtol * |e|: a one-step int8
    difference is equal, another method's weights (an error the size of the values) are not."""
    int8 = Tolerance(atol=0.1, rtol=0.04, derivation="test")
    want = torch.tensor([0.0, 2.0, -5.0])
    assert equal(want + torch.tensor([0.09, 0.17, -0.29]), want, tolerance=int8)
    assert not equal(want + torch.tensor([0.0, 0.0, 0.35]), want, tolerance=int8)
    assert not equal(want + torch.tensor([0.09, 0.0, 0.0]), want)


def test_inf_equals_inf_of_the_same_sign_and_nothing_else() -> None:
    inf = float("inf")
    want = torch.tensor([inf, -inf, 1.0, float("nan")])
    assert equal(want.clone(), want)
    assert not equal(torch.tensor([-inf, -inf, 1.0, float("nan")]), want)
    assert not equal(torch.tensor([1e30, -inf, 1.0, float("nan")]), want)  # finite is never within inf
    assert not equal(torch.tensor([inf, -inf, inf, float("nan")]), want)


def test_an_infinite_element_leaves_the_noise_of_the_others_measured() -> None:
    """A bf16 result with an inf beside eager's float64 run: the noise is the finite elements', not NaN."""
    inf = float("inf")
    want = torch.tensor([1.0, inf], dtype=torch.bfloat16)
    wide = torch.tensor([1.05, inf], dtype=torch.float64)
    assert equal(torch.tensor([1.09, inf]), want, wide)
    assert not equal(torch.tensor([1.2, inf]), want, wide)
    overflowed = torch.tensor([1.0, 1e300], dtype=torch.float64)  # inf in bf16 alone: compared exactly
    assert equal(torch.tensor([1.0, inf]), want, overflowed)
    assert not equal(torch.tensor([1.0, 3e38]), want, overflowed)


def test_integers_are_exact() -> None:
    assert not equal(torch.tensor([3]), torch.tensor([2]))
    assert equal(torch.tensor([2]), torch.tensor([2]))


@pytest.mark.parametrize("name", [f"{n}_in_{d}" for n in REDUCED_PRECISION_OF for d in ("bf16", "fp16")])
def test_reduced_precision_scenarios_have_a_wide_run(name: str) -> None:
    calls = Program(BY_NAME[name].spec).eager()
    assert all(c.wide is not None and c.wide.outputs[0].dtype == torch.float64 for c in calls)
    assert calls[0].outputs[0].dtype == getattr(torch, BY_NAME[name].spec.dtype)


@pytest.mark.parametrize(
    ("variant", "rule"),
    [
        ("BindsByKey", "E1"),  # reads another method's same-named tensor
        ("StateCopiedPerMethod", "E3"),  # a private copy of shared state
        ("ZeroInitState", "E5"),  # a zeroed buffer
        ("NoSharing", "S1"),
        ("MetadataOnly", "S2"),
    ],
)
def test_broken_variants_are_caught_on_reduced_precision_scenarios(
    variant: str, rule: str, pytester: pytest.Pytester
) -> None:
    result = pytester.runpytest_inprocess(
        str(suite_path()),
        f"--ptn-backend=broken_backends:{variant}",
        "-m",
        rule,
        "-k",
        "_in_bf16 or _in_fp16",
        "-p",
        "no:cacheprovider",
        "-rf",
    )
    failed = [line for line in result.outlines if line.startswith("FAILED")]
    for dtype in ("bf16", "fp16"):
        assert any(f"_in_{dtype}" in line for line in failed), f"{variant} breaks {rule} in {dtype}: {failed}"


def test_kernels_that_compute_differently_pass_every_isolation_rule(pytester: pytest.Pytester) -> None:
    """InexactKernels' results are 6% off eager in every dtype, its methods alone the same: no E rule
    fails (a verdict is about isolation), and A1 reports it, a SHOULD not met."""
    result = pytester.runpytest_inprocess(
        str(suite_path()),
        "--ptn-backend=broken_backends:InexactKernels",
        "-m",
        "E1 or E3 or E4 or E5 or A1",
        "-k",
        "kv_cache or private_same_shape_buffers",
        "-p",
        "no:cacheprovider",
        "-rx",
    )
    outcomes = result.parseoutcomes()
    assert "failed" not in outcomes and outcomes.get("passed", 0) >= 10, outcomes
    result.stdout.fnmatch_lines(["*SHOULD rule A1 not met*"])
