"""What a program holds that the rules are about (pytest_ptn.check.hazards), and the rules a program without
a family of hazards leaves with no case of it to check: check_program's result says it, and so does
program_hazards without lowering."""

from __future__ import annotations

import torch

from pytest_ptn.check import check_program, program_hazards


class PrefillDecode(torch.nn.Module):
    """Every hazard: two `lifted_tensor_0` with other bytes, one weight in both methods, a cache prefill
    writes and decode reads, decode loaded after prefill ran."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(4.0), requires_grad=False)
        self.register_buffer("cache", torch.zeros(4))

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        self.cache.add_(x)
        return x * self.w + torch.tensor([1.0, 2.0, 3.0, 4.0])

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w + self.cache + torch.tensor([10.0, 20.0, 30.0, 40.0])


class Head(torch.nn.Module):
    """A separately built method with its own weight, under its own name."""

    def __init__(self, name: str, seed: int) -> None:
        super().__init__()
        self.register_parameter(
            name, torch.nn.Parameter(torch.randn(4, generator=torch.Generator().manual_seed(seed)))
        )
        self.name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * getattr(self, self.name)


X = torch.ones(4)


def test_a_program_without_collisions_names_the_rules_that_checked_nothing() -> None:
    """Two heads, each its own weight, no state, each called once."""
    heads = {"classify": Head("a", 0), "regress": Head("b", 1)}
    findings = check_program(heads, {"classify": (X,), "regress": (X,)}, backend="reference")
    assert findings == []
    assert findings.hazards.lines() == [
        "methods loaded lazily, at their first call: regress after classify ran",
        "no constant name appears in two methods: P1, S2, S3 had no collision to check",
        "no tensor is held in two places, by identity or equal bytes: S1, P4 had no duplicate to check",
        "no buffer is bound by two methods: E3, P2 had no shared state to check",
    ]
    assert findings.hazards.unchecked_rules == ("P1", "P2", "P4", "E3", "S1", "S2", "S3")


def test_every_hazard_is_named_where_it_is() -> None:
    hazards = program_hazards(
        PrefillDecode(), {"prefill": (X,), "decode": (X,)}, [("prefill", (X,)), ("decode", (X,))]
    )
    assert hazards.collisions == {"lifted_tensor_0": ("prefill", "decode")}
    assert hazards.shared == ((("prefill", "w"), ("decode", "w")),)
    assert hazards.shared_state == {"cache": ("prefill", "decode")} and hazards.writers["cache"] == (
        "prefill",
    )
    assert hazards.late_loads == {"decode": ("prefill",)}
    assert hazards.unchecked == {}
    assert hazards.lines() == [
        "names minted in several methods with different bytes: 'lifted_tensor_0' (prefill, decode)",
        "tensors shared by identity: prefill:w = decode:w",
        "state shared across methods: 'cache' (prefill, decode; written by prefill)",
        "methods loaded lazily, at their first call: decode after prefill ran",
    ]


def test_a_name_holding_equal_bytes_in_two_methods_is_no_collision() -> None:
    class Same(torch.nn.Module):
        def prefill(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.tensor([1.0, 2.0, 3.0, 4.0])

        def decode(self, x: torch.Tensor) -> torch.Tensor:
            return x - torch.tensor([1.0, 2.0, 3.0, 4.0])

    hazards = program_hazards(Same(), {"prefill": (X,), "decode": (X,)})
    assert hazards.collisions == {} and hazards.shared_names == ("lifted_tensor_0",)
    assert hazards.equal == ((("prefill", "lifted_tensor_0"), ("decode", "lifted_tensor_0")),)
    assert (
        "no constant name holds different bytes in two methods: P1, S2, S3 had no collision to check"
        in hazards.lines()
    )
