"""check_program runs the rules on a user's own multi-method module."""

from __future__ import annotations

import torch
from broken_backends import BindsByKey

from pytest_ptn.check import check_program


class PrefillDecode(torch.nn.Module):
    """Two methods: each builds its own `torch.tensor` constant (both exported as `lifted_tensor_0`)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(4.0), requires_grad=False)
        self.register_buffer("cache", torch.zeros(4))

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        self.cache.add_(x)
        return x * self.w + torch.tensor([1.0, 2.0, 3.0, 4.0])

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w + self.cache + torch.tensor([10.0, 20.0, 30.0, 40.0])


METHODS = {"prefill": (torch.ones(4),), "decode": (torch.ones(4),)}
CALLS = [("prefill", (torch.ones(4),)), ("decode", (torch.ones(4),)), ("prefill", (torch.ones(4),))]


def test_reference_backend_is_clean() -> None:
    assert check_program(PrefillDecode(), METHODS, CALLS) == []


def test_a_name_sharing_loader_is_found() -> None:
    findings = check_program(PrefillDecode(), METHODS, CALLS, backend=BindsByKey())
    assert any(f.startswith("E1: call #1 decode()") for f in findings), findings
    assert any(f.startswith("S2:") for f in findings), findings


def test_unknown_backend_is_an_error() -> None:
    import pytest

    from pytest_ptn.backend import BackendNotFound

    with pytest.raises(BackendNotFound, match="no-such-backend"):
        check_program(PrefillDecode(), METHODS, backend="no-such-backend")
