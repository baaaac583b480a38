"""The fuzz strategies find a name-sharing loader and shrink to the smallest program that shows it."""

from __future__ import annotations

from pathlib import Path

from broken_backends import BindsByKey
from hypothesis import HealthCheck, Phase, find, given, settings

from pytest_ptn.harness import check_spec
from pytest_ptn.spec import ProgramSpec
from pytest_ptn.strategies import program_specs, reproducer


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(program_specs())
def test_generated_programs_are_valid(spec: ProgramSpec) -> None:
    """Every draw is a program a correct backend must accept: the rules planner never rejects it."""
    from pytest_ptn.programs.build import Program
    from pytest_ptn.programs.exported import constants_of, functionalize
    from pytest_ptn.reference.planner import plan_package

    plan_package({m: constants_of(ep) for m, ep in functionalize(Program(spec).export()).items()})


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(program_specs(stateful=False))
def test_stateless_programs_write_no_state_and_still_collide(spec: ProgramSpec) -> None:
    """For a backend that keeps no state between calls (the TOSA reference model): no method writes a
    buffer, and every method still reads constants."""
    assert not spec.written()
    assert all(m.reads for m in spec.methods)


def test_name_sharing_loader_shrinks_to_two_methods_one_constant_each(
    tmp_path: Path, warm_torch: None
) -> None:
    backend = BindsByKey()
    tmp = iter(range(10**6))

    def wrong(spec: ProgramSpec) -> bool:
        workdir = tmp_path / str(next(tmp))
        workdir.mkdir()
        try:
            return bool(check_spec(backend, spec, workdir))
        except Exception:  # a tensor of the wrong shape bound by name breaks the graph: also wrong
            return True

    smallest = find(
        program_specs(max_methods=3, max_constants=2, max_calls=2),
        wrong,
        settings=settings(
            max_examples=60,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    print(reproducer(smallest))
    assert len(smallest.methods) <= 2
    assert all(len(m.constants) <= 1 and len(m.reads) <= 1 for m in smallest.methods), reproducer(smallest)
    assert len(smallest.methods) == 2, "one method alone cannot read another's constant"
    namespace: dict = {}
    exec(reproducer(smallest), namespace)  # the reproducer is valid code defining a test
    assert callable(namespace["test_reproducer"])


def test_only_the_nightly_profile_shrinks() -> None:
    """A known failure is an expected failure in CI: shrinking it would spend hypothesis's whole shrink
    budget lowering ever smaller programs. Nightly shrinks (and the test above shrinks with its own
    settings, whatever the profile)."""

    ci, nightly = settings.get_profile("ptn-ci"), settings.get_profile("ptn-nightly")
    assert Phase.shrink not in ci.phases and Phase.explain not in ci.phases
    assert Phase.generate in ci.phases
    assert Phase.shrink in nightly.phases


def test_drawn_methods_mostly_repeat_a_graph() -> None:
    """The draws go to names, values and sharing over a bounded set of method graphs, so most methods of
    the CI profile's programs find a decomposed form to reuse (a new graph costs ~0.3 s a method)."""
    from pytest_ptn.programs.build import Program
    from pytest_ptn.programs.exported import form_key

    keys: list[str] = []

    @settings(settings.get_profile("ptn-ci"), max_examples=30)
    @given(program_specs())
    def draw(spec: ProgramSpec) -> None:
        keys.extend(form_key(ep) for ep in Program(spec).export().values())

    draw()
    assert len(set(keys)) <= len(keys) / 2, f"{len(set(keys))} graphs among {len(keys)} methods"


def test_every_name_family_is_drawn() -> None:
    """Each name of the pool (quantization's and the lifted families included) is some constant's leaf."""
    from pytest_ptn.strategies import NAMES

    seen: set[str] = set()

    @settings(max_examples=200, derandomize=True, database=None, phases=[Phase.generate])
    @given(program_specs())
    def draw(spec: ProgramSpec) -> None:
        seen.update(c.leaf for m in spec.methods for c in m.constants)
        seen.update(c.leaf for c in spec.shared)

    draw()
    assert set(NAMES) <= seen, sorted(set(NAMES) - seen)


def _draws(n: int) -> list[ProgramSpec]:
    drawn: list[ProgramSpec] = []

    @settings(max_examples=n, deadline=None, derandomize=True, database=None)
    @given(program_specs())
    def collect(spec: ProgramSpec) -> None:
        drawn.append(spec)

    collect()
    return drawn


def test_values_are_drawn_where_content_sharing_bugs_hide(warm_torch: None) -> None:
    """Every relation of the lattice (pytest_ptn.programs.survey.Relation) between two tensors of a program,
    bfloat16 and int16 among the dtypes, and never a pair of one leaf name that only looks alike (a wrong
    value would be by-name and lookalike at once)."""
    from pytest_ptn.programs.survey import Relation, held_by, looks_alike, survey_of

    relations: set[Relation] = set()
    dtypes: set[str] = set()
    for spec in _draws(300):  # as many as tests/test_survey.py's sample
        held = held_by(spec)
        relations |= set(survey_of(held).relations)
        dtypes |= {str(h.tensor.dtype) for h in held}
        for i, a in enumerate(held):
            for b in held[i + 1 :]:
                tied = a.tensor.untyped_storage().data_ptr() == b.tensor.untyped_storage().data_ptr()
                if a.leaf == b.leaf and not tied:  # a view of one storage is no lookalike
                    assert not looks_alike(a.tensor, b.tensor), f"{a.key!r}, {b.key!r}: by-name or content?"
    assert {"torch.bfloat16", "torch.int16", "torch.bool"} <= dtypes, sorted(dtypes)
    assert set(Relation) <= relations, sorted(set(Relation) - relations)
