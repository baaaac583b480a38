"""The openvino backend: what it needs, what it says about the precision it computes in, and that it runs.

The lowering test needs executorch, openvino and nncf (``pip install -e '.[test,executorch,openvino]'``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from pytest_ptn.backends import openvino
from pytest_ptn.harness import Case
from pytest_ptn.programs.catalogue import BY_NAME


def test_a_missing_toolchain_is_named_with_the_extra_that_installs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "nncf" else real(name))
    availability = openvino.OpenvinoBackend.availability()
    assert not availability.available
    assert availability.reason.startswith("nncf not installed")
    assert "pytest-ptn[executorch,openvino]" in availability.reason


def test_a_cpu_that_computes_f32_in_bf16_is_said_up_front(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    monkeypatch.setattr(openvino, "cpu_inference_precision", lambda: "bf16")
    availability = openvino.OpenvinoBackend.availability()
    assert availability.available
    assert "computes float32 programs in bf16" in availability.reason
    assert {"executorch", "torch", "openvino", "nncf"} <= set(availability.versions)


def test_each_method_runs_in_its_own_openvino_blob(tmp_path: Path) -> None:
    for module in ("executorch", "openvino", "nncf"):
        pytest.importorskip(module)
    case = Case(openvino.OpenvinoBackend(), BY_NAME["shared_weight"], lambda name: tmp_path)
    assert not case.run_sequence(case.load())
    assert b"OpenvinoBackend" in case.lower().path.read_bytes()
