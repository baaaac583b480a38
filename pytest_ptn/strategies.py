"""Hypothesis strategies for programs that collide on purpose, for the fuzz test and your own ``@given``.

Name-collision bugs live in names, values, dtypes, which constants and buffers methods share, how many
methods there are and in what order they run, not in graph structure; and every new graph costs an export
and a decomposition (~0.3 s a method), where a graph seen before with other names and values reuses its
decomposed form (programs.exported.FunctionalForms). So each method takes its graph from a fixed menu,
``METHOD_SHAPES`` (the family, dtype and shape of what it reads, in order, and the state it writes), and
the draws go to everything else: a name for each constant from ``NAMES`` (every colliding family the
toolchains mint, quantization's included), so which constants methods share and which names collide, its
values, the methods and the calls.

Every program drawn is valid (nothing a correct backend may reject): mutable buffers are shared (one FQN)
or private with a name no other method uses, and no name contains ``/``. A method reads every constant it
owns, and every method runs at least once. Shrinking goes towards two methods of the first (one own
constant) shape and the first names of the pool.

    from hypothesis import given
    from pytest_ptn.strategies import program_specs

    @given(program_specs(max_methods=3))
    def test_my_backend(spec): ...
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import strategies as st

from pytest_ptn.spec import Constant, Method, ProgramSpec, Write

METHOD_NAMES = ("prefill", "decode", "encoder", "decoder", "forward", "step", "m6", "m7")
"""The method names a program draws from: the entry points real multi-method programs have, then more."""
NAMES = (
    "w",
    "_tensor_constant0",
    "weight",
    "_lifted_tensor_constant0",
    "_frozen_param0",
    "_scale_0",
    "_zero_point_0",
    "bias",
    "kv",
    "cache",
    "_tensor_constant1",
    "_frozen_param1",
    "_scale_1",
    "proj",
    "embedding",
    "k_cache",
    "freqs_cos",
    "mask",
)
"""Constant names: the users' own (``weight``, ``kv``), the tensor constants torch mints per method
(``_tensor_constant<i>``; ``lifted_tensor_<i>`` is left to the literals, which get it: a buffer of that name
beside a literal fails torch's own ``run_decompositions`` with "`lifted_tensor_0` is not a buffer", a torch
bug every backend would show), the scalars ExecuTorch lifts
(``_lifted_tensor_constant<i>``) and the constants quantization mints per method (``_frozen_param<i>``,
``_scale_<i>``, ``_zero_point_<i>``) and the leaf names of the zoo's upstream models (llama's KV cache,
rope tables and mask), as names of parameters, buffers and attributes, so they collide
across methods and with what a backend mints itself."""


@dataclass(frozen=True)
class Slot:
    """A constant of a method's graph but its name and values: the method's own, or the ``root``-th
    constant of the shared root (``shared.<name>``, one tensor for every method reading it)."""

    constant: Constant
    """Its family, dtype, shape and persistence; the draw gives it a name and a seed."""
    root: int | None = None
    """Its index in ``ROOT`` for a constant of the shared root; None for the method's own."""


def _slot(
    family: str, dtype: str = "float32", shape: tuple[int, ...] = (4,), persistent: bool = True
) -> Slot:
    return Slot(Constant("", family, dtype=dtype, shape=shape, persistent=persistent))


def _scalar(value: float) -> Slot:
    """A Python float in ``forward``: its value is in the graph, so each shape has its own."""
    return Slot(Constant("", "scalar", shape=(), values=(value,)))


ROOT = (_slot("parameter").constant, _slot("attribute", shape=(16,)).constant, _slot("buffer").constant)
"""The shared root of a program that has one: every method's export holds all of it (read or not), so it is
part of every method's graph and drawn whole or not at all; its buffer is the state methods share."""


def _root(i: int) -> Slot:
    return Slot(ROOT[i], root=i)


@dataclass(frozen=True)
class MethodShape:
    """One method's graph, names and values aside: what it reads, in order, and the state it writes (a
    buffer it updates with ``op``, then reads)."""

    reads: tuple[Slot, ...]
    """The constants it reads, in order: one output each."""
    state: Slot | None = None
    """The buffer it writes, or None for a method that only reads."""
    op: str = "add"
    """How it writes ``state`` (pytest_ptn.spec.Write: ``add``, ``copy``, ``index_copy``)."""

    @property
    def slots(self) -> tuple[Slot, ...]:
        """Every constant of the graph, the written buffer last: each gets a name drawn for it."""
        return (*self.reads, *((self.state,) if self.state is not None else ()))


METHOD_SHAPES = (
    MethodShape((_slot("parameter"),)),
    MethodShape((_slot("buffer"), _root(2))),  # reads the state others write: a KV cache's decode
    MethodShape((_slot("parameter"), _slot("attribute", shape=(16,))), state=_root(2)),
    MethodShape((_scalar(0.125), _slot("attribute", "int64", (4, 4)))),
    MethodShape(
        (_slot("buffer", "int32", persistent=False), _root(0)),
        state=_slot("buffer", shape=(2, 4)),
        op="index_copy",
    ),
    MethodShape(
        (_slot("attribute", "float16"), _slot("literal", "int32", (16,)), _slot("buffer", "int64", (2, 4)))
    ),
    MethodShape((_root(1), _slot("buffer", "float16", (4, 4))), state=_root(2), op="copy"),
    MethodShape((_slot("parameter", "float16", (2, 4)), _scalar(2.0)), state=_slot("buffer")),
)
"""The bounded set of method graphs the fuzz test draws from, each with and without a shared root (two
scalars of other values collide as ``_lifted_tensor_constant<i>`` once ExecuTorch lifts them): together
every family, the four dtypes, the four shapes, own and shared constants, private and shared
state written three ways. The first is the smallest program a shrink can reach."""


@dataclass(frozen=True)
class _Drawn:
    name: str
    shape: MethodShape
    names: tuple[str, ...]
    seeds: tuple[int, ...]


@st.composite
def _drawn_method(draw: st.DrawFn, max_constants: int, stateful: bool) -> _Drawn:
    name = METHOD_NAMES[draw(st.integers(0, len(METHOD_NAMES) - 1))]
    fitting = [s for s in METHOD_SHAPES if len(s.slots) <= max_constants and (stateful or s.state is None)]
    shape = fitting[draw(st.integers(0, len(fitting) - 1))]
    n = len(shape.slots)
    names = tuple(draw(st.lists(st.sampled_from(NAMES), min_size=n, max_size=n, unique=True)))
    seeds = tuple(draw(st.integers(0, 3)) for _ in range(n))
    return _Drawn(name, shape, names, seeds)


@st.composite
def program_specs(
    draw: st.DrawFn, max_methods: int = 4, max_constants: int = 3, max_calls: int = 6, stateful: bool = True
) -> ProgramSpec:
    """A program of colliding names; ``stateful=False``: no method writes state (for a backend that keeps
    none between calls), its methods drawn from the shapes that only read."""
    shared: tuple[Constant, ...] = ()
    if draw(st.booleans()):
        names = draw(st.lists(st.sampled_from(NAMES), min_size=len(ROOT), max_size=len(ROOT), unique=True))
        shared = tuple(
            replace(c, name=n, seed=draw(st.integers(0, 3))) for c, n in zip(ROOT, names, strict=True)
        )
    # Methods are drawn as one list (name and body together) so the shrinker can delete any of them, not
    # only the last.
    drawn = draw(
        st.lists(
            _drawn_method(max_constants, stateful),
            unique_by=lambda m: m.name,
            min_size=min(2, max_methods),
            max_size=max_methods,
        )
    )
    methods = [_resolve(m, shared) for m in drawn]
    names = [m.name for m in methods]
    calls = draw(st.lists(st.sampled_from(names), max_size=max_calls))
    calls += [m for m in names if m not in calls]  # every method runs at least once
    return ProgramSpec(methods=tuple(methods), shared=shared, calls=tuple(calls))


def _resolve(m: _Drawn, shared: tuple[Constant, ...]) -> Method:
    """``m`` as a method of a program with the shared root ``shared``. Without a root, a root slot is the
    method's own constant; own state is named ``<method>_state``, a name no other method uses, and an own
    constant that would take the name of a root constant the method reads takes the next free name."""
    read_roots = {shared[s.root].name for s in m.shape.slots if shared and s.root is not None}
    free = iter(n for n in NAMES if n not in m.names and n not in read_roots)
    own: list[Constant] = []
    reads: list[str] = []
    for slot, name, seed in zip(m.shape.slots, m.names, m.seeds, strict=True):
        if shared and slot.root is not None:
            reads.append(shared[slot.root].name)
            continue
        if slot is m.shape.state:
            name = f"{m.name}_state"
        elif name in read_roots:
            name = next(free)
        own.append(replace(slot.constant, name=name, seed=seed))
        reads.append(name)
    writes = (Write(reads[-1], m.shape.op),) if m.shape.state is not None else ()
    return Method(m.name, tuple(own), reads=tuple(reads), writes=writes)


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
"""The hypothesis profiles ``--ptn-fuzz-profile`` picks from: CI's 12 derandomized examples, unshrunk, and
the nightly's 400 random ones, shrunk, with a database."""


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
