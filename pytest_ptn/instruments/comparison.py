"""When a backend's tensor equals eager's: the one bound every comparison of the suite and check_program uses
(outputs, state, S4, E5's first calls, fuzz, repro bundles).

A backend computes a program in the program's dtype, as eager does, but it may round at other points
(fused kernels, another accumulation order, a wider accumulator). So "equal" cannot mean a fixed 1e-5 for a
bf16 program, whose results are only good to about 2**-8 of their magnitude. For an element ``e`` of eager's
result, ``w`` the same element when eager runs the same program (same values, exactly widened) in float64,
and ``have`` the backend's, the two agree when

    |have - e| <= FLOOR * (1 + |e|) + 2 * eps(dtype) * |e| + 2 * max |e - w|

- ``2 * eps * |e|``: eager and the backend each round the result to the dtype once; the two roundings can
  land a step (``eps * |e|`` at most, for round-to-nearest) apart each way. This is the one bf16 step (0.0078
  near 1) a correct bf16 backend shows on part of its elements.
- ``2 * max |e - w|``, the max over the tensor: how far eager's own arithmetic in the dtype moved its
  results from the float64 ones (rounding of intermediates, accumulated through the program). A correct
  backend rounds at other points and in another order, so its error is as large but falls on other elements:
  each of the two results is within that distance of the float64 one, so they are within twice it of each
  other. (Per element it would not hold: where eager happens to land on the float64 value, a correct
  backend still shows the program's typical error, a few bf16 steps after two transformer layers.)
- ``FLOOR``: the float32 bound of conformance spec v1 (1e-5, absolute and relative), below which float32 and
  wider programs are equal, as they always were.

A backend that quantizes each method (Capability.QUANTIZE) is compared with its own converted per-method
modules, not the float program; it computes them with integer kernels that round activations on their own
(a quantized value one step from the converted module's), so it declares what that may cost, a
``Tolerance`` (``Backend.tolerance``, with its derivation), added to the bound: ``+ atol + rtol * |e|``.

No wide run is needed where the dtype is float32 or wider (``|e - w|`` is then far below FLOOR). Integer and
bool results are compared exactly, and so are values no arithmetic touched (E5: a buffer as loaded).

inf and NaN are values: inf equals inf of the same sign and NaN equals NaN, while a finite value never equals
an infinite one (``|have - inf|`` is inf, within an inf bound). Eager's noise is measured where eager and its
wide run are both finite: an element that overflows in the dtype alone says nothing of the rounding of the
others, so it is compared exactly.

What stays visible: another method's same-named tensor, a private copy of shared state, a zeroed buffer change
an element by the size of the values themselves, while the bound for bf16 is about 1.6% of the element plus
eager's own noise at it; tests/test_comparison.py shows each broken reference variant is still caught on the
bf16 and fp16 scenarios.

Two questions use this bound, with two truths (pytest_ptn.check.alone):
- **isolation** (E1, E3, E4, E5): does each method of the program compute what the same backend computes for
  it alone, its state explicit? ``want`` is then the backend's own result for the method alone, and the
  noise term is still eager's (``eager``: the eager result ``wide`` pairs with): two computations of the same
  values in the same dtype, by the same kernels, differ by no more than two computations by any kernels.
  Kernels that compute differently from eager show alone too, so they never make an isolation failure.
- **accuracy** (A1): does the method alone agree with eager? ``want`` is eager's result, as above.

A backend that computes float32 programs in a coarser dtype on this machine (OpenVINO's CPU default on
AVX512_BF16 CPUs: ``Backend.float32_computed_in``) declares it, and its float32 results are compared with the
bound of that dtype (``computed_in``): its rounding steps, not float32's. The precision is said in the run
header and in every failure, so a verdict holds on a CPU with bf16 arithmetic and on one without.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

FLOOR = 1e-5
"""Absolute and relative: the float32 bound of conformance spec v1."""

WIDE_DTYPE = "float64"
"""The dtype eager reruns a reduced-precision program in, to measure its own rounding."""


@dataclass(frozen=True)
class Tolerance:
    """What a quantizing backend's results may differ by from its converted modules, beyond the dtype's bound:
    ``atol + rtol * |e|`` per element. ``derivation`` says where the numbers come from (shown in failures)."""

    atol: float
    rtol: float
    derivation: str

    def __str__(self) -> str:
        return f"atol {self.atol:g} + rtol {self.rtol:g} (declared by the backend: {self.derivation})"


def reduced_precision(t: torch.Tensor) -> bool:
    """A floating dtype coarser than float32 (bf16, fp16, the float8s): its results need a wide run."""
    import torch

    return t.is_floating_point() and torch.finfo(t.dtype).eps > torch.finfo(torch.float32).eps


def allowed(
    want: torch.Tensor,
    wide: torch.Tensor | None = None,
    tolerance: Tolerance | None = None,
    computed_in: torch.dtype | None = None,
    eager: torch.Tensor | None = None,
) -> torch.Tensor:
    """The largest difference from ``want`` each element may show, in float64 (see the module): ``wide`` is
    eager's float64 run beside ``eager`` (by default ``want`` itself, eager's result); ``computed_in`` a
    coarser dtype the backend declares it computes ``want``'s in."""
    import torch

    e = want.detach().to(torch.float64)
    eps = torch.finfo(want.dtype).eps if want.is_floating_point() else 0.0
    if computed_in is not None and want.is_floating_point():
        eps = max(eps, torch.finfo(computed_in).eps)
    bound = FLOOR * (1 + e.abs()) + 2 * eps * e.abs()
    noise_of = want if eager is None else eager
    if wide is not None and wide.shape == noise_of.shape and noise_of.numel():
        n, w = noise_of.detach().to(torch.float64), wide.detach().to(torch.float64)
        finite = n.isfinite() & w.isfinite()
        if bool(finite.any()):
            bound = bound + 2 * (n - w)[finite].abs().max()
    if tolerance is not None:
        bound = bound + tolerance.atol + tolerance.rtol * e.abs()
    return bound


def close(
    have: torch.Tensor,
    want: torch.Tensor,
    wide: torch.Tensor | None = None,
    tolerance: Tolerance | None = None,
    computed_in: torch.dtype | None = None,
    eager: torch.Tensor | None = None,
) -> torch.Tensor:
    """Elementwise: ``have`` equals ``want`` within the bound (same shape required; NaN equals NaN, inf
    equals inf of the same sign and nothing else)."""
    import torch

    if not (want.is_floating_point() or want.is_complex()):
        return have.detach().to(want.dtype) == want.detach()
    h, e = have.detach().to(torch.float64), want.detach().to(torch.float64)
    bound = allowed(want, wide, tolerance, computed_in, eager)
    within = ((h - e).abs() <= bound) & h.isfinite() & e.isfinite()
    return within | (h == e) | (h.isnan() & e.isnan())


def equal(
    have: torch.Tensor,
    want: torch.Tensor,
    wide: torch.Tensor | None = None,
    tolerance: Tolerance | None = None,
    computed_in: torch.dtype | None = None,
    eager: torch.Tensor | None = None,
) -> bool:
    """``have`` has ``want``'s shape and every element within the bound."""
    return have.shape == want.shape and bool(close(have, want, wide, tolerance, computed_in, eager).all())


def difference(have: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """``|have - want|`` elementwise in float64, 0 where the two are equal (inf and inf of the same sign
    differ by nothing, not by NaN)."""
    import torch

    h, w = have.detach().to(torch.float64), want.detach().to(torch.float64)
    return torch.where(h == w, 0.0, (h - w).abs())


def snr_db(have: torch.Tensor, want: torch.Tensor) -> float:
    """Signal-to-noise ratio of ``have`` against ``want`` in dB, ``20 log10(|have| / |have - want|)`` (L2
    norms), as ExecuTorch's backend test suite reports it (its ErrorStatistics.sqnr); inf where they agree."""
    import math

    import torch

    noise = float(torch.linalg.vector_norm(difference(have, want)))
    signal = float(torch.linalg.vector_norm(have.detach().to(torch.float64)))
    if noise == 0:
        return math.inf
    return 20 * math.log10(signal / noise) if signal else -math.inf
