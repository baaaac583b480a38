"""Hypothesis strategies for programs that collide on purpose, for the fuzz test and your own ``@given``.

Names come from small pools, so methods keep reusing ``w``, ``_tensor_constant0`` and friends with other
tensors; seeds come from a small range, so equal tensors under other names happen too. Every program drawn
is valid (nothing a correct backend may reject): mutable buffers are shared (one FQN) or private with a
name no other method uses, and no name contains ``/``. A method reads every constant it owns, and every
method runs at least once. Shrinking goes towards two methods, fewer constants and the first names of each
pool.

    from hypothesis import given
    from pytest_ptn.strategies import program_specs

    @given(program_specs(max_methods=3))
    def test_my_backend(spec): ...
"""

from __future__ import annotations

from hypothesis import strategies as st

from pytest_ptn.spec import Constant, Method, ProgramSpec, Write

METHOD_NAMES = ("prefill", "decode", "encoder", "decoder", "forward", "step", "m6", "m7")
CONSTANT_NAMES = ("w", "_tensor_constant0", "bias")
SHARED_NAMES = ("kv", "weight", "cache")
DTYPES = ("float32", "float16", "int32", "int64")
SHAPES = ((4,), (16,), (2, 4), (4, 4))


@st.composite
def constants(draw: st.DrawFn, name: str, shared: bool = False) -> Constant:
    """One read-only constant named ``name`` of any family (literals and scalars only inside a method)."""
    families = (
        ("parameter", "buffer", "attribute")
        if shared
        else ("parameter", "buffer", "attribute", "literal", "scalar")
    )
    family = draw(st.sampled_from(families))
    seed = draw(st.integers(0, 3))
    if family == "scalar":
        return Constant(name, "scalar", shape=(), values=(float(seed) + 0.5,))
    dtype = draw(st.sampled_from(DTYPES if family != "parameter" else DTYPES[:2]))
    shape = draw(st.sampled_from(SHAPES))
    persistent = family != "buffer" or draw(st.booleans())
    return Constant(name, family, dtype=dtype, shape=shape, seed=seed, persistent=persistent)


@st.composite
def _method(
    draw: st.DrawFn, name: str, shared_names: list[str], shared_state: set[str], max_constants: int
) -> Method:
    named = st.sampled_from(CONSTANT_NAMES).flatmap(constants)  # a name and its tensor shrink together
    own = draw(st.lists(named, unique_by=lambda c: c.name, min_size=1, max_size=max_constants))
    writes = []
    if draw(st.booleans()):  # private state: a name no other method can use
        own.append(Constant(f"{name}_state", "buffer", shape=(4,), seed=draw(st.integers(0, 3))))
        writes.append(Write(f"{name}_state", "add"))
    writes += [Write(target, "add") for target in sorted(shared_state) if draw(st.booleans())]
    shared_reads = draw(st.lists(st.sampled_from(shared_names), unique=True)) if shared_names else []
    reads = tuple(c.name for c in own) + tuple(shared_reads)  # a constant nobody reads is noise
    return Method(name, tuple(own), reads=reads, writes=tuple(writes))


@st.composite
def program_specs(
    draw: st.DrawFn, max_methods: int = 4, max_constants: int = 3, max_calls: int = 6
) -> ProgramSpec:
    shared_names = draw(st.lists(st.sampled_from(SHARED_NAMES), unique=True, max_size=2))
    shared_state = {n for n in shared_names if draw(st.booleans())}
    shared = tuple(
        Constant(n, "buffer", shape=(4,), seed=draw(st.integers(0, 3)))
        if n in shared_state
        else draw(constants(n, shared=True))
        for n in shared_names
    )
    # Methods are drawn as one list (name and body together) so the shrinker can delete any of them, not
    # only the last: a name fixes the method's private state name whatever else was deleted.
    method = st.integers(0, len(METHOD_NAMES) - 1).flatmap(
        lambda i: _method(METHOD_NAMES[i], shared_names, shared_state, max_constants)
    )
    methods = draw(
        st.lists(method, unique_by=lambda m: m.name, min_size=min(2, max_methods), max_size=max_methods)
    )
    names = [m.name for m in methods]
    calls = draw(st.lists(st.sampled_from(names), max_size=max_calls))
    calls += [m for m in names if m not in calls]  # every method runs at least once
    return ProgramSpec(methods=tuple(methods), shared=shared, calls=tuple(calls))


def _register_profiles() -> None:
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    common = settings(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
    # Both pin derandomize and database: a profile that leaves them out inherits hypothesis's CI defaults.
    # CI does not shrink (nor explain, which needs the shrink): a backend's known failure is an expected
    # failure there, and shrinking it spent hypothesis's whole shrink budget lowering ever smaller programs
    # (minutes per backend) to print a reproducer nobody reads. Nightly shrinks to the smallest program.
    settings.register_profile(
        "ptn-ci",
        max_examples=12,
        derandomize=True,
        database=None,
        phases=[p for p in Phase if p not in (Phase.shrink, Phase.explain)],
        parent=common,
    )
    settings.register_profile(
        "ptn-nightly",
        max_examples=400,
        derandomize=False,
        database=DirectoryBasedExampleDatabase(".hypothesis/ptn"),
        parent=common,
    )


_register_profiles()
PROFILES = ("ptn-ci", "ptn-nightly")


def reproducer(spec: ProgramSpec) -> str:
    """A pytest test reproducing ``spec`` on the backend given with ``--ptn-backend``: one method (one shared
    constant) a line, compact enough for a report to keep it whole, and a failure that says what differs."""
    import dataclasses

    fields = []
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            items = "".join(f"            {item!r},\n" for item in value)
            fields.append(f"        {f.name}=(\n{items}        ),\n")
        else:
            fields.append(f"        {f.name}={value!r},\n")
    return (
        "from pytest_ptn import *  # noqa: F403\n"
        "from pytest_ptn.harness import check_spec, fail_on\n\n\n"
        "def test_reproducer(ptn_backend, tmp_path):\n"
        f"    spec = ProgramSpec(\n{''.join(fields)}    )\n"
        '    fail_on(check_spec(ptn_backend, spec, tmp_path), "outputs differ from eager")\n'
    )
