"""The truth isolation is judged against shares nothing with the program's run: each method alone is
lowered, loaded and run in a fresh process of its own, so a cache that outlives a program (a runtime's own,
by name, per process, as the ExecuTorch CUDA delegate's) never makes the alone run as wrong as the program,
and a by-name bug is an E failure (MUST) whatever capabilities the backend declares."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from broken_backends import RUNTIME_CACHE, ExecuteOnlyByName

from pytest_ptn.check import check_program
from pytest_ptn.check.alone import CallAlone, MethodsAlone, suspects
from pytest_ptn.plugin import suite_path
from pytest_ptn.programs.exported import functionalize


class Weighted(torch.nn.Module):
    """Two methods reading one weight ``w``: nothing in the program itself collides."""

    def __init__(self, seed: int, dtype: torch.dtype):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = torch.nn.Parameter(torch.randn(4, 4, generator=g).to(dtype))

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.w).sum(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_cache_that_outlives_a_program_is_e1_on_a_backend_that_declares_execute_only(
    dtype: torch.dtype,
) -> None:
    """A second program whose ``w`` the runtime's cache hands the first one's: its methods alone, in this
    process, would read the same cache and be as wrong (A1, a SHOULD, no E finding before the alone runs
    left the process)."""
    RUNTIME_CACHE.clear()
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(0)).to(dtype)
    methods = {"prefill": (x,), "decode": (x,)}
    assert check_program(Weighted(1, dtype), methods, backend=ExecuteOnlyByName()) == []
    findings = check_program(Weighted(2, dtype), methods, backend=ExecuteOnlyByName())
    assert {(f.rule, f.method) for f in findings} >= {("E1", "prefill"), ("E1", "decode")}, findings
    assert "A1" not in {f.rule for f in findings}, findings


def test_the_methods_alone_leave_nothing_in_this_process(tmp_path: Path) -> None:
    """What a method alone loads stays in its own process: this process's runtime cache is never written,
    and what it holds never reaches the method alone."""
    RUNTIME_CACHE.clear()
    poison = torch.full((4, 4), 1000.0)
    RUNTIME_CACHE["w"] = poison
    program = Weighted(3, torch.float32)
    x = torch.ones(4, 4)
    alone = MethodsAlone(
        ExecuteOnlyByName(),
        lambda: functionalize(
            {name: torch.export.export(_Method(program, name), (x,)) for name in ("prefill", "decode")}
        ),
        {},
        lambda name: tmp_path / name,
    )
    ran = alone.run([("prefill", (x,)), ("decode", (x,))])
    assert torch.equal(ran[0].outputs[0], x @ program.w.detach())
    assert torch.equal(ran[1].outputs[0], (x * program.w.detach()).sum(0))
    assert list(RUNTIME_CACHE) == ["w"] and RUNTIME_CACHE["w"] is poison


class _Method(torch.nn.Module):
    def __init__(self, program: Weighted, name: str):
        super().__init__()
        self.program, self.name = program, name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.program, self.name)(x)


def test_an_alone_run_far_beyond_the_other_methods_accuracy_is_suspect() -> None:
    """One method alone as far from eager as a wrong tensor, the others exact: the alone run is suspect; every
    method as far (an upstream kernel bug all show): the backend is inaccurate, nothing is suspect."""
    want = torch.tensor([1.0, -2.0, 3.0])
    right, wrong = CallAlone([want.clone()], [], {}), CallAlone([-want], [], {})
    eager = [("prefill", [want]), ("decode", [want])]
    found = suspects([right, wrong], eager)
    assert list(found) == ["decode"] and "suspect" in found["decode"]
    assert suspects([wrong, wrong], eager) == {}
    assert suspects([wrong], eager[:1]) == {}


def test_the_suite_fails_e1_on_a_runtime_cache_by_name_in_float32_and_bf16(
    pytester: pytest.Pytester, warm_torch: None
) -> None:
    RUNTIME_CACHE.clear()
    result = pytester.runpytest_inprocess(
        str(suite_path()),
        "--ptn-backend=broken_backends:ExecuteOnlyByName",
        "-m",
        "E1",
        "-k",
        "same_metadata_different_bytes and not fp16",
        "-p",
        "no:cacheprovider",
    )
    failed = [line for line in result.stdout.lines if line.startswith("FAILED")]
    assert any("in_bf16" in f for f in failed) and any("in_bf16" not in f for f in failed), failed
