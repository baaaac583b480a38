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

Values are drawn on purpose, not only at random: a bug in content sharing (a dedupe or a cache keyed on
less than the full content) hides where random values never go. Beside a seed's draw, a constant of a
parameter, buffer or attribute may be zeros (a fresh KV cache), equal to another constant of the program
but for one to three elements near its end (``nudged``: where a digest of a prefix or a sample of the bytes
does not reach; some tensors are 4 KiB, longer than such a prefix), or the bytes of another constant of
another dtype of one element size (``drawn_as``: float32 and int32; float16, bfloat16 and int16). Such a
pair never shares a name, so a wrong value is either by-name or lookalike, never both; zeros share
neither name nor dtype and shape with another tensor. A shrink goes towards the seed's draw.

    from hypothesis import given
    from pytest_ptn.strategies import program_specs

    @given(program_specs(max_methods=3))
    def test_my_backend(spec): ...
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from hypothesis import strategies as st

from pytest_ptn.spec import ELEMENT_SIZES, Constant, Method, ProgramSpec, Write

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


LONG = (32, 32)
"""A shape of 4 KiB in float32: longer than the prefix a partial digest reads."""

ROOT = (_slot("parameter").constant, _slot("attribute", shape=LONG).constant, _slot("buffer").constant)
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
    MethodShape((_slot("parameter"), _slot("attribute", shape=LONG)), state=_root(2)),
    MethodShape((_scalar(0.125), _slot("attribute", "int64", (4, 4)))),
    MethodShape(
        (_slot("buffer", "int32", persistent=False), _root(0)),
        state=_slot("buffer", shape=(2, 4)),
        op="index_copy",
    ),
    MethodShape((_slot("attribute", "float16"), _slot("literal", "int32", (16,)), _slot("buffer", "int16"))),
    MethodShape((_root(1), _slot("buffer", "float16", (4, 4))), state=_root(2), op="copy"),
    MethodShape((_slot("parameter", "bfloat16"), _scalar(2.0)), state=_slot("buffer")),
)
"""The bounded set of method graphs the fuzz test draws from, each with and without a shared root (two
scalars of other values collide as ``_lifted_tensor_constant<i>`` once ExecuTorch lifts them): together
every family, the six dtypes (three of two bytes, two of four, each of one shape with the others of its
size), the five shapes (one of 4 KiB), own and shared constants, private and shared state written three
ways. The first is the smallest program a shrink can reach."""


VALUE_FORMS = ("seed", "seed", "zeros", "near", "bits")
"""How a constant's values are drawn (the seed's draw half the time, and first, where a shrink goes):
zeros, near-equal to another constant, or another constant's bytes under this one's dtype."""
ZEROS_UP_TO = 16
"""The most elements a zero tensor is drawn with: its values are written out in the program."""
BITS_FROM = {"int32": ("float32",), "int16": ("float16", "bfloat16"), "float16": ("bfloat16",)}
"""The dtypes whose bytes a constant of each dtype may hold: a float's bytes as an integer or as another
float of its size, never an integer's as a float (the patterns of negative integers are NaNs)."""
BITS_FROM["bfloat16"] = ("float16",)


@dataclass(frozen=True)
class _Drawn:
    name: str
    shape: MethodShape
    names: tuple[str, ...]
    seeds: tuple[int, ...]
    forms: tuple[_Form, ...]


@dataclass(frozen=True)
class _Form:
    """How one constant's values are drawn: a VALUE_FORMS entry, which earlier constant it is like (an
    index into the candidates), and how far from the end its nudged elements are."""

    form: str
    like: int
    nudges: tuple[int, ...]


_form = st.builds(
    _Form,
    st.sampled_from(VALUE_FORMS),
    st.integers(0, 7),
    st.lists(st.integers(0, 63), min_size=1, max_size=3, unique=True).map(tuple),
)


@st.composite
def _drawn_method(draw: st.DrawFn, max_constants: int, stateful: bool) -> _Drawn:
    name = METHOD_NAMES[draw(st.integers(0, len(METHOD_NAMES) - 1))]
    fitting = [s for s in METHOD_SHAPES if len(s.slots) <= max_constants and (stateful or s.state is None)]
    shape = fitting[draw(st.integers(0, len(fitting) - 1))]
    n = len(shape.slots)
    names = tuple(draw(st.lists(st.sampled_from(NAMES), min_size=n, max_size=n, unique=True)))
    seeds = tuple(draw(st.integers(0, 3)) for _ in range(n))
    return _Drawn(name, shape, names, seeds, tuple(draw(_form) for _ in range(n)))


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
    forms = [
        [f for slot, f in zip(m.shape.slots, m.forms, strict=True) if not (shared and slot.root is not None)]
        for m in drawn
    ]
    methods = _with_values([_resolve(m, shared) for m in drawn], forms, shared)
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


_VALUED = ("parameter", "buffer", "attribute")
"""The families whose values a form may choose: the others' values are in the graph (a new graph each)."""


def _with_values(
    methods: list[Method], forms: list[list[_Form]], shared: tuple[Constant, ...]
) -> list[Method]:
    """``methods`` with each own constant's values drawn as its form says (``forms``: one per own
    constant), in order, a near-equal or same-bytes constant taking them from one drawn before it; a form
    nothing earlier fits, or that would make a lookalike of a same-named constant, leaves the seed's draw.
    Zeros take a name, and a dtype and shape, no other tensor of the program has: bound in another's place
    (by name, or by a cache of metadata alone), they would read as that tensor zero-filled."""
    earlier: list[Constant] = list(shared)
    every = [*shared, *(c for m in methods for c in m.constants)]
    names = Counter(c.name for c in every)
    kinds = Counter((c.dtype, c.shape) for c in every)
    out = []
    for m, drawn in zip(methods, forms, strict=True):
        own = []
        for c, f in zip(m.constants, drawn, strict=True):
            if c.family in _VALUED:
                valued = _valued(c, f, earlier)
                if _zeros(valued) and (names[c.name] > 1 or kinds[c.dtype, c.shape] > 1):
                    valued = c  # bound in another's place, zeros read as that tensor zero-filled
                if not any(e.name == c.name and _looks_alike(valued, e) for e in earlier):
                    c = valued
                for e in earlier:  # the seed's draw beside same-named zeros of its dtype: the zeros too
                    if e.name == c.name and _looks_alike(c, e) and (e.dtype, e.shape) == (c.dtype, c.shape):
                        c = replace(c, seed=e.seed, values=e.values, drawn_as=e.drawn_as, nudged=e.nudged)
            own.append(c)
            earlier.append(c)
        out.append(replace(m, constants=tuple(own)))
    return out


def _valued(c: Constant, f: _Form, earlier: list[Constant]) -> Constant:
    """``c`` with its values drawn as ``f`` says, from a constant of ``earlier`` of another name."""
    n = _numel(c.shape)
    if f.form == "zeros":
        return replace(c, values=(0.0,) * n) if n <= ZEROS_UP_TO else c
    others = [e for e in earlier if e.family in _VALUED and e.name != c.name and e.shape == c.shape]
    if f.form == "near":
        fits = [e for e in others if e.dtype == c.dtype]
        if fits:
            e = fits[f.like % len(fits)]
            nudged = tuple(sorted({n - 1 - d % n for d in f.nudges}))
            return replace(c, seed=e.seed, values=e.values, drawn_as=e.drawn_as, nudged=nudged)
    if f.form == "bits":
        fits = [
            e for e in others if e.dtype in BITS_FROM.get(c.dtype, ()) and not e.drawn_as and not e.nudged
        ]
        if fits:
            e = fits[f.like % len(fits)]
            return replace(c, seed=e.seed, values=e.values, drawn_as=e.dtype)
    return c


def _looks_alike(a: Constant, b: Constant) -> bool:
    """Whether two drawn constants hold tensors that differ but look alike to a check of less than their
    content (pytest_ptn.check.explain.looks_alike): zeros of one size under two dtypes or shapes, one draw
    nudged apart, one bit pattern under two dtypes; or zeros beside a tensor of their dtype and shape, which
    a by-name binding of the zeros could not tell from zero-filling."""
    if a.shape != b.shape and not (_zeros(a) and _zeros(b)):
        return False
    if _zeros(a) != _zeros(b):  # binding the zeros in the other's place is zero-filling it
        return (a.dtype, a.shape) == (b.dtype, b.shape)
    if _zeros(a) and _zeros(b):
        size = [ELEMENT_SIZES[c.dtype] * _numel(c.shape) for c in (a, b)]
        return size[0] == size[1] and (a.dtype, a.shape) != (b.dtype, b.shape)
    if (a.seed, a.values, a.drawn_as or a.dtype) != (b.seed, b.values, b.drawn_as or b.dtype):
        return False
    return a.nudged != b.nudged if a.dtype == b.dtype else not (a.nudged or b.nudged)


def _zeros(c: Constant) -> bool:
    return c.values is not None and not any(c.values) and not c.nudged


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


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
