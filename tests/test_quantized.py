"""A quantized program's truth (pytest_ptn.programs.quantized), with a stand-in recipe so no executorch is
needed: calibration's writes are undone, shared state is tied, and a failure can say whose tensor was read."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from pytest_ptn.programs.build import Program
from pytest_ptn.programs.catalogue import BY_NAME, QUANTIZABLE
from pytest_ptn.programs.quantized import QuantizedProgram
from pytest_ptn.programs.source import set_tensor
from pytest_ptn.spec import Constant, Method, ProgramSpec, Write


def calibrated_only(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> nn.Module:
    """A recipe that changes no value but runs forward once, as calibration does (writing the buffers)."""
    with torch.no_grad():
        module(*inputs)
    return module


def test_the_truth_is_the_converted_modules_with_calibration_undone_and_state_shared() -> None:
    program = Program(BY_NAME["quantized_cache"].spec)
    quantized = QuantizedProgram(program, calibrated_only)
    for got, want in zip(quantized.eager(), program.eager(), strict=True):
        assert got.method == want.method
        assert torch.equal(got.outputs[0], want.outputs[0]), "decode must see prefill's rows, from zeros"
    assert set(quantized.export()) == {"prefill", "decode"}


def test_a_failure_says_whose_same_named_tensor_a_method_read() -> None:
    program = Program(BY_NAME["quantized_linears"].spec)
    quantized = QuantizedProgram(program, calibrated_only)
    calls = quantized.eager()
    decode = next(i for i, c in enumerate(calls) if c.method == "decode")
    wrong = copy.deepcopy(quantized.converted["decode"])
    set_tensor(wrong, "proj.weight", quantized.converted["prefill"].get_parameter("proj.weight"))
    with torch.no_grad():
        have = wrong(*calls[decode].inputs)
    assert quantized.read_elsewhere(decode, have, None, calls) == [("prefill", "proj.weight")]
    assert quantized.read_elsewhere(decode, calls[decode].outputs[0], None, calls) == []


def test_quantizable_scenarios_compute_no_0d_tensor() -> None:
    """Static int8 XNNPACK cannot lower a 0-d tensor: no node of a quantizable program has one."""
    for scenario in [s for s in BY_NAME.values() if QUANTIZABLE in s.tags]:
        for method, ep in Program(scenario.spec).export().items():
            for node in ep.graph.nodes:
                val = node.meta.get("val")
                assert not (isinstance(val, torch.Tensor) and val.dim() == 0), (scenario.name, method, node)


def test_a_program_of_vectors_writes_by_shift_only() -> None:
    kv = Constant("kv", "buffer", shape=(4, 8))
    with pytest.raises(ValueError, match="writes by shift only"):
        ProgramSpec((Method("m", writes=(Write("kv", "add"),), input_shape=(1, 8)),), (kv,), vectors=True)
    with pytest.raises(ValueError, match="needs a program of vectors"):
        ProgramSpec((Method("m", writes=(Write("kv", "shift"),), input_shape=(1, 8)),), (kv,))
