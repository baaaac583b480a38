"""A functional form is reused only for programs that differ in tensor values and constant names, and always
holds the caller's tensors under the caller's names: what ``run_decompositions({})`` gives, without
decomposing the same graph again."""

from __future__ import annotations

import pytest
import torch

from pytest_ptn.programs import exported
from pytest_ptn.programs.build import Program
from pytest_ptn.programs.catalogue import BY_NAME
from pytest_ptn.programs.exported import FunctionalForms, decompose
from pytest_ptn.spec import Constant, Method, ProgramSpec, Write

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


NAMED = ProgramSpec(
    methods=(
        Method(
            "prefill",
            (
                Constant("a", "parameter", seed=1),
                Constant("b", "buffer", dtype="int32", shape=(2, 4)),
                Constant("t", "literal", dtype="float16"),
            ),
            reads=("a", "b", "t", "kv"),
            writes=(Write("kv"),),
        ),
        Method("decode", (Constant("c", "attribute", shape=(16,)),), reads=("c", "kv")),
    ),
    shared=(Constant("kv", "buffer"),),
)
"""Own constants of each family, a literal, shared state written by one method and read by the other."""


@pytest.mark.parametrize(
    "names",
    [
        {"a": "w", "b": "bias", "c": "weight", "kv": "cache"},
        {"a": "b", "b": "a"},  # swapped: each placeholder takes the other's name
        {"b": "lifted_tensor_0", "c": "_tensor_constant0", "kv": "_frozen_param0"},  # the literal is minted
    ],
    ids=["renamed", "swapped", "minted_names"],
)
def test_a_program_with_other_names_gets_the_form_under_its_own_names(
    names: dict[str, str], decompositions: list[str]
) -> None:
    forms = FunctionalForms(size=8)
    for ep in Program(NAMED).export().values():
        forms.functional(ep)
    program = Program(NAMED.with_names(names))
    before = len(decompositions)
    for method in program.method_names:  # each from its own export: running one mutates shared state
        got = forms.functional(program.export()[method])
        fresh = decompose(program.export()[method])
        assert got.graph_module.code == fresh.graph_module.code
        assert str(got.graph_signature) == str(fresh.graph_signature)
        assert (
            got.state_dict.keys() == fresh.state_dict.keys()
            and got.constants.keys() == fresh.constants.keys()
        )
        inputs = program.example_inputs(method)
        torch.testing.assert_close(got.module()(*inputs), fresh.module()(*inputs))
    assert len(decompositions) == before
    assert forms.reused == len(program.method_names)


def test_constants_moved_to_another_module_are_decomposed_anew(decompositions: list[str]) -> None:
    """Decomposition orders constant inputs by the modules holding them (``decomposed_order``): a private
    buffer made shared, which it then lists after the method's own, is another form, ordered as torch
    orders it."""
    forms = FunctionalForms(size=8)
    own = ProgramSpec(
        methods=(Method("m", (Constant("a", "buffer"), Constant("b", "buffer")), reads=("a", "b")),)
    )
    moved = ProgramSpec(
        methods=(Method("m", (Constant("b", "buffer"),), reads=("a", "b")),),
        shared=(Constant("a", "buffer"),),
    )
    for spec in (own, moved):
        ep = Program(spec).export()["m"]
        got, fresh = forms.functional(ep), decompose(ep)
        assert [s.target for s in got.graph_signature.input_specs] == [
            s.target for s in fresh.graph_signature.input_specs
        ]
    assert len(decompositions) == 2


def test_constants_under_other_module_paths_in_the_same_places_get_one_form(
    decompositions: list[str],
) -> None:
    """Two transformers whose layers are named apart (``layers.0.w`` against ``blocks.0.w``) decompose
    alike: their constants come in the same places, and a submodule's path is copied through, so the second
    is bound to the first's form, under its own paths."""
    forms = FunctionalForms(size=8)
    programs = [
        Program(NAMED.with_names({"a": f"{prefix}.0.w", "b": f"{prefix}.1.w", "c": f"{prefix}.2.w"}))
        for prefix in ("layers", "blocks")
    ]
    for ep in programs[0].export().values():
        forms.functional(ep)
    before = len(decompositions)
    for method in programs[1].method_names:
        got = forms.functional(programs[1].export()[method])
        fresh = decompose(programs[1].export()[method])
        assert got.graph_module.code == fresh.graph_module.code
        assert str(got.graph_signature) == str(fresh.graph_signature)
        assert [e.fqn for e in got.module_call_graph] == [e.fqn for e in fresh.module_call_graph]
        inputs = programs[1].example_inputs(method)
        torch.testing.assert_close(got.module()(*inputs), fresh.module()(*inputs))
    assert len(decompositions) == before
