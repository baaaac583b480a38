"""The survey reads what real programs hold, and the generator and the catalogue hold all of it: a model added
to the zoo with a property no generated program can have fails here (issue 67)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import Phase, given, settings

from pytest_ptn.programs import zoo
from pytest_ptn.programs.build import Program
from pytest_ptn.programs.catalogue import SCENARIOS
from pytest_ptn.programs.survey import (
    EVERY,
    Held,
    Property,
    Relation,
    Survey,
    held_by,
    looks_alike,
    relation_of,
    survey,
    survey_of,
)
from pytest_ptn.spec import Constant, Method, ProgramSpec, Write
from pytest_ptn.strategies import program_specs

DRAWN = 300
"""Programs drawn (derandomized) to learn what the generator holds."""


def _held(method: str, key: str, t: torch.Tensor, written: bool = False) -> Held:
    return Held(method, key, t, written)


def test_a_transformers_layers_are_nested_with_repeated_leaves_and_state_per_layer() -> None:
    w0, w1 = torch.randn(4, 4), torch.randn(4, 4)
    embed = torch.randn(8, 4)
    found = survey_of(
        [
            _held("prefill", "layers.0.attention.wq", w0),
            _held("prefill", "layers.1.attention.wq", w1),
            _held("prefill", "layers.0.kv.k_cache", torch.zeros(2, 4), written=True),
            _held("prefill", "layers.1.kv.k_cache", torch.zeros(2, 4), written=True),
            _held("prefill", "tok_embeddings.weight", embed),
            _held("prefill", "output.weight", embed.t()),
            _held("decode", "layers.0.attention.wq", torch.randn(4, 4)),
            _held("decode", "decoder.layers.0.attention.wq", torch.randn(4, 4)),
        ]
    )
    assert found.depth == 5
    assert set(found.properties) == {
        Property.NESTED,
        Property.LEAF_IN_LAYERS,
        Property.LEAF_ACROSS_METHODS,
        Property.PATH_ACROSS_METHODS,
        Property.COLLIDING_PATH,
        Property.STATE_PER_LAYER,
        Property.PRIVATE_STATE,
        Property.TIED,
        Property.NON_CONTIGUOUS,
    }


def test_flat_numbered_caches_are_state_per_layer_too() -> None:
    found = survey_of(
        [_held("forward", f"key_cache_{i}", torch.zeros(1, 2, 4, 4), written=True) for i in (0, 1)]
    )
    assert {Property.STATE_PER_LAYER, Property.HIGH_RANK, Property.PRIVATE_STATE} <= set(found.properties)


def test_a_view_into_a_larger_storage_and_a_constant_equal_to_state() -> None:
    fused = torch.randn(12, 4)
    initial = torch.randn(4)
    found = survey_of(
        [
            _held("a", "wq", fused[4:8]),
            _held("a", "wv", torch.randn(4, 8)[:, ::2]),
            _held("a", "norm.weight", initial.clone()),
            _held("b", "running", initial.clone(), written=True),
        ]
    )
    assert {Property.VIEW, Property.NON_CONTIGUOUS, Property.PRIVATE_STATE} <= set(found.properties)
    assert Relation.STATE_INITIAL in found.relations


def test_every_relation_of_the_lattice_is_told_apart() -> None:
    x = torch.randn(8, 8, dtype=torch.float64).float()
    cases = {
        Relation.EQUAL: (x, x.clone()),
        Relation.ZEROS: (torch.zeros(4), torch.zeros(2, 4, dtype=torch.int32)),
        Relation.BYTES_OTHER_DTYPE: (x, x.view(torch.int32)),
        Relation.BYTES_OTHER_SHAPE: (x, x.reshape(64)),
        Relation.REORDERED: (x, x.t().contiguous()),
        Relation.NEAR_1E1: (x, x + 0.05 * x.abs().clamp(min=1)),
        Relation.NEAR_1E2: (x, x + 0.005 * x.abs().clamp(min=1)),
        Relation.NEAR_1E3: (x, x + 5e-4 * x.abs().clamp(min=1)),
        Relation.NEAR_1E4: (x, x + 5e-5 * x.abs().clamp(min=1)),
        Relation.NEAR_BOUND: (x, x + 4e-6 * x.abs().clamp(min=1)),
        Relation.PREFIX: (x, torch.cat((x.reshape(-1)[:40], torch.randn(24))).reshape(8, 8)),
        Relation.INDEPENDENT: (x, torch.randn(8, 8)),
    }
    for relation, (a, b) in cases.items():
        assert relation_of(a, b) == relation, relation
        assert looks_alike(a, b) == (relation not in (Relation.EQUAL, Relation.ZEROS, Relation.INDEPENDENT))
    one_changed = x.clone()
    one_changed[7, 7] += 100
    assert looks_alike(x, one_changed)  # a few elements, by however much: a sample of the bytes misses them


def _generated() -> Survey:
    found = Survey()

    @settings(max_examples=DRAWN, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
    @given(program_specs())
    def draw(spec: ProgramSpec) -> None:
        found.__ior__(survey(Program(spec).export()))

    draw()
    return found


@pytest.fixture(scope="module")
def generated() -> Survey:
    """What the fuzz's programs hold: a derandomized sample of them."""
    return _generated()


@pytest.fixture(scope="module")
def catalogue() -> Survey:
    found = Survey()
    for scenario in SCENARIOS:
        if not scenario.needs:
            found |= survey(Program(scenario.spec).export())
    return found


def _real(family: zoo.ZooFamily) -> dict[str, Survey]:
    out = {}
    for model in zoo.MODELS:
        if model.family == family:
            _, inspected = model.scenario()
            out[model.name] = survey(inspected)
    return out


def _holds_all(real: dict[str, Survey], generated: Survey, catalogue: Survey) -> None:
    for name, found in real.items():
        assert not found.found - generated.found, f"{name} holds what no generated program can: " + ", ".join(
            sorted(found.found - generated.found)
        )
        assert not found.found - catalogue.found, (
            f"{name} holds what no catalogue scenario does: "
            + ", ".join(sorted(found.found - catalogue.found))
        )
        assert found.depth <= max(generated.depth, catalogue.depth) + 3  # as deep, give or take a layer


def test_upstreams_models_hold_nothing_the_generator_and_catalogue_do_not(
    generated: Survey, catalogue: Survey, warm_torch: None
) -> None:
    """The zoo's models from executorch.examples (llama with a KV cache per layer, Voxtral's encoder and
    decoder), in float32 and bf16."""
    real = _real(zoo.EXAMPLES)
    assert set(real) == {m.name for m in zoo.MODELS if m.family == zoo.EXAMPLES}
    assert any(Property.STATE_PER_LAYER in s.properties for s in real.values())
    _holds_all(real, generated, catalogue)


@pytest.mark.extra("hf")
def test_optimums_exports_hold_nothing_the_generator_and_catalogue_do_not(
    generated: Survey, catalogue: Survey, warm_torch: None
) -> None:
    """Hugging Face's Llama and Whisper as optimum-executorch exports them."""
    _holds_all(_real(zoo.OPTIMUM), generated, catalogue)


def test_the_generator_holds_every_property_the_issue_names(generated: Survey) -> None:
    """What real programs hold and the first generator did not: nested paths whose leaves repeat across
    layers and methods, state per layer, tied, transposed and other non-contiguous tensors, content at every
    magnitude down to the comparison bound, one byte pattern under two shapes, the same elements in another
    order, an equal prefix, a constant equal to a state's initial value."""
    wanted = {
        Property.NESTED,
        Property.LEAF_IN_LAYERS,
        Property.LEAF_ACROSS_METHODS,
        Property.STATE_PER_LAYER,
        Property.TIED,
        Property.NON_CONTIGUOUS,
        Property.VIEW,
        Property.BOOL,
        Property.HIGH_RANK,
        *(r for r in Relation if r != Relation.INDEPENDENT),
    }
    assert not wanted - generated.found, sorted(wanted - generated.found)


@settings(max_examples=40, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
@given(program_specs())
def test_a_drawn_programs_spec_holds_what_its_export_does(spec: ProgramSpec) -> None:
    """The fuzz's coverage line reads each program from its spec (``held_by``, no export): it finds what
    the survey of the program's exports finds."""
    assert survey_of(held_by(spec)).found == survey(Program(spec).export()).found


def test_the_survey_of_a_spec_is_that_of_its_export() -> None:
    """What the fuzz's coverage line counts (a program's export, surveyed) names properties the survey
    knows, and only those."""
    spec = ProgramSpec(
        methods=(
            Method(
                "prefill",
                (Constant("layers.0.w", "parameter", shape=(4, 4), seed=1, layout="transposed"),),
                reads=("layers.0.w", "layers.0.kv"),
                writes=(Write("layers.0.kv", "add"),),
            ),
            Method(
                "decode", (Constant("layers.1.w", "parameter", shape=(4, 4), seed=2),), reads=("layers.1.w",)
            ),
        ),
        shared=(Constant("layers.0.kv", "buffer", shape=(4,), seed=3),),
    )
    found = survey(Program(spec).export())
    assert {str(f) for f in found.found} <= set(map(str, EVERY))
    assert {Property.NESTED, Property.NON_CONTIGUOUS, Property.SHARED_STATE} <= found.found
    assert Relation.SAME_LEAF in found.relations
