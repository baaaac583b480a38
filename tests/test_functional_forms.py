"""A functional form is reused only for programs that differ in tensor values, and always holds the caller's
tensors: what ``run_decompositions({})`` gives, without decomposing the same graph again."""

from __future__ import annotations

import pytest
import torch

from pytest_ptn.programs import exported
from pytest_ptn.programs.build import Program
from pytest_ptn.programs.catalogue import BY_NAME
from pytest_ptn.programs.exported import FunctionalForms, decompose

VARIED = ["colliding_literals", "kv_cache", "cond_constants", "input_mutation", "torchao_int8_weights"]
"""Literals, state written in place, a branch subgraph, a mutated input, a tensor subclass weight."""


@pytest.fixture
def decompositions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The code of every program actually decomposed."""
    seen: list[str] = []

    def counted(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
        seen.append(ep.graph_module.code)
        return decompose(ep)

    monkeypatch.setattr(exported, "decompose", counted)
    return seen


@pytest.mark.parametrize("name", VARIED)
def test_a_program_with_other_values_gets_the_form_holding_its_own_tensors(
    name: str, decompositions: list[str]
) -> None:
    forms = FunctionalForms(size=8)
    program = Program(BY_NAME[name].spec)
    first = {m: forms.functional(ep) for m, ep in program.export().items()}
    other = program.with_other_values().export()
    before = len(decompositions)
    reused = {m: forms.functional(ep) for m, ep in other.items()}
    decomposed = len(decompositions) - before
    for method, ep in other.items():
        fresh = decompose(ep)
        got = reused[method]
        assert got.graph_module.code == fresh.graph_module.code
        assert str(got.graph_signature) == str(fresh.graph_signature)
        assert set(got.state_dict) == set(fresh.state_dict) and set(got.constants) == set(fresh.constants)
        if set(fresh.state_dict) == set(ep.state_dict):  # a tensor subclass is unwrapped anew each time
            assert all(got.state_dict[k] is ep.state_dict[k] for k in ep.state_dict)
            assert all(got.constants[k] is ep.constants[k] for k in ep.constants)
            assert got.graph_module is not first[method].graph_module
        inputs = program.example_inputs(method)
        expected = fresh.module()(*[t.clone() for t in inputs])
        torch.testing.assert_close(got.module()(*[t.clone() for t in inputs]), expected)
    unwraps = name == "torchao_int8_weights"
    assert decomposed == (len(other) if unwraps else 0)


class Scale(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


@pytest.mark.parametrize(("size", "decomposed"), [(2, 2), (1, 3)])
def test_other_shapes_are_decomposed_and_the_oldest_forms_dropped(
    size: int, decomposed: int, decompositions: list[str]
) -> None:
    forms = FunctionalForms(size=size)
    for n in (4, 8, 4):
        forms.functional(torch.export.export(Scale(n), (torch.ones(n),), strict=False))
    assert len(decompositions) == decomposed


def test_a_caller_rewriting_its_graph_leaves_the_form_intact(decompositions: list[str]) -> None:
    forms = FunctionalForms(size=8)
    program = Program(BY_NAME["colliding_literals"].spec)
    method, ep = next(iter(program.export().items()))
    mine = forms.functional(ep)
    for node in list(mine.graph.nodes):
        if node.op == "call_function":
            node.target = torch.ops.aten.neg.default
            node.args = node.args[:1]
    again = forms.functional(program.export()[method])
    assert again.graph_module.code == decompose(program.export()[method]).graph_module.code
    assert len(decompositions) == 1
