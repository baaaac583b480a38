"""A method's export served from the form of a graph exported before under other names and values is the
export torch makes of it: same code, signature, keys, the module's own tensors, same outputs."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from pytest_ptn.programs.build import Program, export_key
from pytest_ptn.programs.catalogue import BY_NAME
from pytest_ptn.programs.export_forms import ExportForms
from pytest_ptn.spec import Constant, Method, ProgramSpec
from pytest_ptn.strategies import NAMES, program_specs


def _assert_same_export(got: torch.export.ExportedProgram, module: torch.nn.Module, inputs: tuple) -> None:
    fresh = torch.export.export(module, inputs, strict=False)
    assert got.graph_module.code == fresh.graph_module.code
    assert str(got.graph_signature) == str(fresh.graph_signature)
    assert list(got.state_dict) == list(fresh.state_dict) and list(got.constants) == list(fresh.constants)
    assert all(got.state_dict[k] is fresh.state_dict[k] for k in fresh.state_dict)  # the module's own
    for k, t in fresh.constants.items():
        assert (
            got.constants[k] is t
            if any(t is v for v in module.state_dict(keep_vars=True).values())
            else (torch.equal(got.constants[k], t))
        )
    assert got.example_inputs[0] == inputs
    # Each on its own copy: both hold the module's tensors, and a method that writes state writes them.
    outputs = [copy.deepcopy(ep).module()(*[t.clone() for t in inputs]) for ep in (got, fresh)]
    torch.testing.assert_close(*outputs)


def _served(spec: ProgramSpec, other: ProgramSpec) -> int:
    """Export ``other``'s methods to fill a cache, then each of ``spec``'s from it, checked against a fresh
    export of the same modules; how many were served from a form."""
    forms = ExportForms(size=64)
    built = Program(other)
    for name, module in built.modules().items():
        forms.export(module, built.example_inputs(name), *export_key(other, other.method(name)))
    warm = forms.reused
    program = Program(spec)
    for name, module in program.modules().items():
        inputs = program.example_inputs(name)
        got = forms.export(module, inputs, *export_key(spec, spec.method(name)))
        _assert_same_export(got, module, inputs)
    return forms.reused - warm


def _other_names(spec: ProgramSpec) -> ProgramSpec:
    """``spec`` with every constant's leaf renamed, its module tree kept (which orders torch's constants)."""
    used = {c.name for c in spec.shared} | {c.name for m in spec.methods for c in m.constants}
    leaves = {n.rpartition(".")[2] for n in used}
    free = iter(n for n in (*NAMES, *(f"k{i}" for i in range(32))) if n not in leaves)
    renamed = {leaf: next(free) for leaf in sorted(leaves)}
    return spec.with_names(
        {n: n[: len(n) - len(leaf)] + renamed[leaf] for n in used if (leaf := n.rpartition(".")[2])}
    )


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_catalogue_scenario_is_served_as_torch_exports_it(name: str) -> None:
    spec = BY_NAME[name].spec
    keyed = [m for m in spec.methods if export_key(spec, m)[0] is not None]
    assert _served(spec, _other_names(spec)) == len(keyed)


def test_a_program_differing_in_names_alone_is_served_from_forms() -> None:
    spec = BY_NAME["kv_cache"].spec
    assert _served(spec, _other_names(spec)) == len(spec.methods)


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(program_specs(), program_specs())
def test_drawn_programs_are_served_as_torch_exports_them(spec: ProgramSpec, other: ProgramSpec) -> None:
    _served(spec, other)


def test_a_branch_is_exported_afresh() -> None:
    spec = BY_NAME["cond_constants"].spec
    assert _served(spec, _other_names(spec)) == 0


def test_a_constant_taking_the_name_of_a_tensor_export_mints_is_exported_afresh() -> None:
    """torch names a literal's tensor around the program's own names: ``lifted_tensor_0`` is the literal's
    until a buffer takes it."""
    spec = ProgramSpec(
        methods=(
            Method("m", (Constant("b", "buffer"), Constant("t", "literal", dtype="int32")), reads=("b", "t")),
        )
    )
    assert _served(spec.with_names({"b": "lifted_tensor_0"}), spec) == 0
    assert _served(spec.with_names({"b": "w"}), spec) == 1
