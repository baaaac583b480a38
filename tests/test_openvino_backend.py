"""The openvino backend: what it needs, what it says about the precision it computes in (on a CPU faked to
compute float32 in bf16, and faked not to), and that it runs.

The lowering test needs the openvino extra (``pip install -e '.[test,executorch,openvino]'``); the others fake
what they need, so they give the same verdict with or without it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from broken_backends import BindsByKey

from pytest_ptn.backend import ReducedPrecision
from pytest_ptn.backends import openvino
from pytest_ptn.harness import Case
from pytest_ptn.programs.catalogue import BY_NAME
from pytest_ptn.reference.loader import ReferenceLoaded


def test_a_missing_toolchain_is_named_with_the_extra_that_installs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # executorch and openvino faked present, so the reason is nncf's whatever this venv has installed
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "nncf" else object())
    availability = openvino.OpenvinoBackend.availability()
    assert not availability.available
    assert availability.reason.startswith("nncf not installed")
    assert "pytest-ptn[executorch,openvino]" in availability.reason


BF16_CPU = "OpenVINO CPU computes float32 programs in bf16 (INFERENCE_PRECISION_HINT=bf16, AVX512_BF16)"


@pytest.fixture
def bf16_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU with AVX512_BF16, where OpenVINO's CPU plugin defaults to bf16 (faked, whatever this CPU has)."""
    monkeypatch.setattr(openvino, "cpu_inference_precision", lambda: "bf16")
    monkeypatch.setattr(openvino, "bf16_flags", lambda: ["avx512_bf16"])


def test_a_cpu_that_computes_f32_in_bf16_is_said_up_front(
    bf16_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # every toolchain "installed"
    availability = openvino.OpenvinoBackend.availability()
    assert availability.available
    assert availability.reason.startswith(BF16_CPU)
    assert "the delegate cannot ask for f32" in availability.reason
    assert {"executorch", "torch", "openvino", "nncf"} <= set(availability.versions)


def test_the_backend_declares_the_precision_it_computes_float32_in(
    bf16_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert openvino.OpenvinoBackend().float32_computed_in() == ReducedPrecision("bfloat16", BF16_CPU)
    monkeypatch.setattr(openvino, "cpu_inference_precision", lambda: "f32")
    assert openvino.OpenvinoBackend().float32_computed_in() is None


class _RoundedToBf16(ReferenceLoaded):
    def run(self, method: str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [t.to(torch.bfloat16).to(t.dtype) for t in super().run(method, inputs)]


class _KeyedByNameRoundedToBf16(_RoundedToBf16, BindsByKey.loaded):
    pass


class RoundsToBf16(BindsByKey):
    """A float32 program computed in bf16, as OpenVINO does on an AVX512_BF16 CPU, without saying so;
    ``loaded`` says whether methods also read each other's tensors."""

    loaded = _RoundedToBf16


class Bf16Cpu(RoundsToBf16):
    """The same, declared (Backend.float32_computed_in), as the openvino backend declares it."""

    def float32_computed_in(self) -> ReducedPrecision | None:
        return ReducedPrecision("bfloat16", BF16_CPU)


class Bf16CpuByName(Bf16Cpu):
    """Declared, and methods read each other's tensors too."""

    loaded = _KeyedByNameRoundedToBf16


def _case(backend: BindsByKey, tmp_path: Path) -> Case:
    return Case(backend, BY_NAME["same_metadata_different_bytes"], lambda name: tmp_path)


@pytest.mark.parametrize(
    ("backend", "isolation"),
    [(Bf16Cpu, []), (Bf16CpuByName, [f"it read method 'prefill''s 'weight'; {BF16_CPU}"])],
)
def test_a_declared_bf16_precision_is_the_bound_of_both_questions(
    tmp_path: Path, backend: type[Bf16Cpu], isolation: list[str]
) -> None:
    """A float32 program the backend declares it computes in bf16 agrees with eager within bf16 rounding, on
    any CPU: no isolation and no accuracy finding; another method's tensor is still E1, labelled."""
    case = _case(backend(), tmp_path)
    mismatches = [str(m) for m in case.run_sequence(case.load())]
    assert len(mismatches) == len(isolation), mismatches
    for mismatch, label in zip(mismatches, isolation, strict=True):
        assert mismatch.endswith(label)
    assert case.accuracy() == []


def test_an_undeclared_bf16_precision_is_accuracy_not_isolation(tmp_path: Path) -> None:
    """The same rounding, not declared: each method alone shows it too, so it is A1 with its numbers."""
    case = _case(RoundsToBf16(), tmp_path)
    assert case.run_sequence(case.load()) == []
    accuracy = [str(m) for m in case.accuracy()]
    assert accuracy and all("SNR" in m and "max rel error" in m for m in accuracy), accuracy


def test_a_backend_computing_float32_labels_nothing(tmp_path: Path) -> None:
    case = _case(BindsByKey(), tmp_path)
    (mismatch,) = [str(m) for m in case.run_sequence(case.load())]
    assert "bfloat16" not in mismatch and mismatch.endswith("it read method 'prefill''s 'weight'")


@pytest.mark.extra("openvino")
def test_each_method_runs_in_its_own_openvino_blob(tmp_path: Path) -> None:
    case = Case(openvino.OpenvinoBackend(), BY_NAME["shared_weight"], lambda name: tmp_path)
    assert not case.run_sequence(case.load())
    assert b"OpenvinoBackend" in case.lower().path.read_bytes()
