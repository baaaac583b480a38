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
    """Each name of the pool (quantization's and the lifted families included) names some constant."""
    from pytest_ptn.strategies import NAMES

    seen: set[str] = set()

    @settings(max_examples=200, derandomize=True, database=None, phases=[Phase.generate])
    @given(program_specs())
    def draw(spec: ProgramSpec) -> None:
        seen.update(c.name for m in spec.methods for c in m.constants)
        seen.update(c.name for c in spec.shared)

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
    """Zeros of two dtypes of one size, a tensor equal to another but for elements past the first 1 KiB,
    one bit pattern under two dtypes, and bfloat16: what a dedupe or a cache keyed on less than the full
    content confuses, and what seeds alone never draw."""
    from pytest_ptn.check.explain import looks_alike
    from pytest_ptn.programs.build import make_tensor

    seen: set[str] = set()
    for spec in _draws(200):
        constants = [*spec.shared, *(c for m in spec.methods for c in m.constants)]
        seen |= {c.dtype for c in constants}
        tensors = {id(c): make_tensor(c) for c in constants}
        for i, a in enumerate(constants):
            for b in constants[i + 1 :]:
                ta, tb = tensors[id(a)], tensors[id(b)]
                if not looks_alike(ta, tb):
                    continue
                assert a.name != b.name, f"a lookalike pair shares the name {a.name!r}: by-name or content?"
                if ta.dtype != tb.dtype and not ta.any():
                    seen.add("zeros of two dtypes")
                elif ta.dtype != tb.dtype:
                    seen.add(f"bits {sorted((str(ta.dtype), str(tb.dtype)))}")
                elif ta.nbytes > 1024:
                    differ = (ta.reshape(-1) != tb.reshape(-1)).nonzero()
                    if int(differ.min()) * ta.element_size() >= 1024:
                        seen.add("near-equal past the first KiB")
    wanted = {"bfloat16", "int16", "zeros of two dtypes", "near-equal past the first KiB"}
    assert wanted <= seen, sorted(seen)
    assert any(s.startswith("bits") for s in seen), sorted(seen)
