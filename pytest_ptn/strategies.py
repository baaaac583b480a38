"""Hypothesis strategies for programs that collide on purpose, for the fuzz test and your own ``@given``.

Name-collision bugs live in names, values, dtypes, layouts, which constants and buffers methods share, how
many methods there are and in what order they run, not in graph structure; and every new graph costs an
export and a decomposition (~0.3 s a method), where a graph seen before with other names and values reuses
its decomposed form (programs.exported.FunctionalForms). So each method takes its graph from a fixed menu,
``METHOD_SHAPES`` (the family, dtype, shape and layout of what it reads, in order, what is tied to what, and
the state it writes), and the draws go to everything else: a path for each constant (a leaf from ``NAMES``,
every colliding family the toolchains mint, quantization's included, under a module from ``PATHS``, as real
models nest their weights in layers), its values, the methods and the calls.

The menu holds what real programs hold, as ``pytest_ptn.programs.survey`` reads it from upstream's models
(tests/test_survey.py keeps it so): nested paths whose leaves repeat across layers and methods, state per
layer, tied weights (an output layer that is the embedding's transpose, a view of its storage), transposed,
strided and offset tensors, bool masks beside floats, tensors of rank 3, 0-d scalars, and tensors over 1 KiB.

Every program drawn is valid (nothing a correct backend may reject): mutable buffers are shared (one FQN)
or private with a name no other method uses, and no name contains ``/``. A method reads every constant it
owns, and every method runs at least once. Shrinking goes towards two methods of the first (one own
constant) shape, paths without a prefix and the first names of the pool.

Values are drawn on purpose, not only at random: a bug in content sharing (a dedupe or a cache keyed on
less than the full content) hides where random values never go. Half the constants are their seed's draw;
the others take a relation (``RELATED``) to a tensor drawn before them, from one lattice
(``pytest_ptn.programs.survey.Relation``): equal, zeros, the same bytes under another dtype or another shape,
the same elements in another order, near-equal at a magnitude from 1e-1 down to just above the comparison
bound (a few elements near the end, or every element for the finer ones), an equal prefix, a constant equal
to a state's initial value, or, for names, the same leaf under another prefix and the same path in another
method. A pair that only looks alike never shares a leaf name, so a wrong value is either by-name or
lookalike, never both; zeros share neither leaf nor dtype and shape with another tensor. A shrink goes
towards independent.

    from hypothesis import given
    from pytest_ptn.strategies import program_specs

    @given(program_specs(max_methods=3))
    def test_my_backend(spec): ...
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import strategies as st

from pytest_ptn.programs.survey import Relation
from pytest_ptn.spec import ELEMENT_SIZES, TENSOR_FAMILIES, Constant, Method, ProgramSpec, Write

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
"""Leaf names: the users' own (``weight``, ``kv``), the tensor constants torch mints per method
(``_tensor_constant<i>``; ``lifted_tensor_<i>`` is left to the literals, which get it: a buffer of that name
beside a literal fails torch's own ``run_decompositions`` with "`lifted_tensor_0` is not a buffer", a torch
bug every backend would show), the scalars ExecuTorch lifts (``_lifted_tensor_constant<i>``) and the
constants quantization mints per method (``_frozen_param<i>``, ``_scale_<i>``, ``_zero_point_<i>``) and the
leaf names of the zoo's upstream models (llama's KV cache, rope tables and mask), as names of parameters,
buffers and attributes, so they collide across methods and with what a backend mints itself."""

PATHS = (
    ("", "", ""),
    ("layers.0.", "layers.1.", "layers.2."),
    ("model.layers.0.attention.",) * 3,
    ("encoder.layers.0.", "encoder.layers.0.", "decoder.layers.0."),
    ("layers.0.", "layers.0.", "layers.1."),
)
"""Where the constants of a program's methods sit in their module's tree, slot by slot (a prefix each; the
first is a shrink's goal): at the top, or in layers, as llama's ``model.layers.0.attention.wq`` and
whisper's ``decoder.layers.0.fc1`` do. A user's name takes its slot's prefix; a name the toolchain mints
(``_tensor_constant0``, ``_frozen_param0``: the names that start with ``_``) stays at the top, where torch
and the quantizers put it. One leaf under two prefixes repeats across layers, in one method or two; under
one prefix in two methods, it is one path in both, so names collide as often as flat ones do. A program
draws one of these trees, not a prefix per constant: torch lists a method's constants as it walks its module
tree (programs.build.export_key), so a graph seen before under another tree is exported again, and a few
trees keep most graphs served from their form."""
ROOT_PATHS = (("", ""), ("layers.0.", "layers.1."), ("model.", "model.rope."))
"""The same for the shared root's two weights."""

LAYER_STYLES = ("layers.{i}.{leaf}", "{leaf}_{i}", "model.layers.{i}.attention.kv_cache.{leaf}")
"""How state per layer is named (a leaf and the layer's number ``i``): llama's nested caches, optimum's flat
``key_cache_0``."""


@dataclass(frozen=True)
class Slot:
    """A constant of a method's graph but its name and values: the method's own, or the ``root``-th
    constant of the shared root (``shared.<name>``, one tensor for every method reading it)."""

    constant: Constant
    """Its family, dtype, shape, persistence and layout; the draw gives it a name and a seed."""
    root: int | None = None
    """Its index in ``ROOT`` for a constant of the shared root; None for the method's own."""
    tied: int | None = None
    """The index among the method's slots of the tensor this one is (tied, its layout saying whether
    transposed): it draws a name only."""


def _slot(
    family: str,
    dtype: str = "float32",
    shape: tuple[int, ...] = (4,),
    persistent: bool = True,
    layout: str = "contiguous",
    tied: int | None = None,
) -> Slot:
    return Slot(
        Constant("slot", family, dtype=dtype, shape=shape, persistent=persistent, layout=layout), tied=tied
    )


def _scalar(value: float) -> Slot:
    """A Python float in ``forward``: its value is in the graph, so each shape has its own."""
    return Slot(Constant("slot", "scalar", shape=(), values=(value,)))


LONG = (32, 32)
"""A shape of 4 KiB in float32: longer than the prefix a partial digest reads."""

ROOT = (
    _slot("parameter").constant,
    _slot("attribute", shape=LONG).constant,
    _slot("buffer").constant,
    _slot("buffer").constant,
)
"""The shared root of a program that has one: every method's export holds all of it (read or not), so it is
part of every method's graph and drawn whole or not at all. Its buffers are the state methods share, one per
layer: the two are named for layer 0 and layer 1 with one leaf (``LAYER_STYLES``)."""
STATE_PER_LAYER = (2, 3)
"""The indices in ``ROOT`` of its two layers' state."""


def _root(i: int) -> Slot:
    return Slot(ROOT[i], root=i)


@dataclass(frozen=True)
class MethodShape:
    """One method's graph, names and values aside: what it reads, in order, and the state it writes (the
    buffers it updates with ``op``, then reads)."""

    reads: tuple[Slot, ...]
    """The constants it reads, in order: one output each."""
    states: tuple[Slot, ...] = ()
    """The buffers it writes (one per layer where there are two)."""
    op: str = "add"
    """How it writes ``states`` (pytest_ptn.spec.Write: ``add``, ``copy``, ``index_copy``)."""

    @property
    def slots(self) -> tuple[Slot, ...]:
        """Every constant of the graph, each once, the written buffers last: each gets a name drawn for it."""
        return (*self.reads, *(s for s in self.states if s not in self.reads))


METHOD_SHAPES = (
    MethodShape((_slot("parameter"),)),
    # reads the state others write, a layer each (a KV cache's decode), beside a strided buffer of its own
    MethodShape((_slot("buffer", shape=(2, 4), layout="strided"), _root(2), _root(3))),
    # two long weights (a content relation at the comparison bound needs one between two of them)
    # two long weights: a content relation at the comparison bound needs one between two of them
    MethodShape((_slot("parameter", shape=LONG), _slot("attribute", shape=LONG)), states=(_root(2),)),
    MethodShape(
        (
            _scalar(0.125),
            _slot("attribute", "int64", (4, 4)),
            _slot("buffer", "bool", (4, 4), persistent=False),
        )
    ),
    MethodShape(
        (_slot("buffer", "int32", persistent=False), _root(0)),
        states=(_slot("buffer", shape=(2, 4)),),
        op="index_copy",
    ),
    MethodShape(
        (
            _slot("attribute", "float16", layout="offset"),
            _slot("literal", "int32", (16,)),
            _slot("buffer", "int16"),
        )
    ),
    MethodShape(
        (_root(1), _slot("buffer", "float16", (4, 4), layout="transposed")), states=(_root(3),), op="copy"
    ),
    MethodShape((_slot("parameter", "bfloat16"), _scalar(2.0)), states=(_slot("buffer"),)),
    # an embedding and its output layer, the embedding's transpose (one storage), beside a tensor of rank 3
    MethodShape(
        (
            _slot("parameter", shape=(4, 4)),
            _slot("parameter", shape=(4, 4), layout="transposed", tied=0),
            _slot("buffer", shape=(2, 2, 4)),
        )
    ),
)
"""The bounded set of method graphs the fuzz test draws from, each with and without a shared root (two
scalars of other values collide as ``_lifted_tensor_constant<i>`` once ExecuTorch lifts them): together
every family, seven dtypes (bool; three of two bytes, two of four, each of one shape with the others of its
size), one element count under three shapes ((4, 4), (16,), (2, 2, 4)), a 4 KiB tensor, own and shared
constants, private state and shared state written three ways, a layer each (the root's two buffers), the
four layouts and a tied transpose (an embedding and its output layer, one storage). The first is the
smallest program a shrink can reach."""

RELATED = (
    Relation.EQUAL,
    Relation.ZEROS,
    Relation.BYTES_OTHER_DTYPE,
    Relation.BYTES_OTHER_SHAPE,
    Relation.REORDERED,
    Relation.NEAR_1E1,
    Relation.NEAR_1E2,
    Relation.NEAR_1E3,
    Relation.NEAR_1E4,
    Relation.NEAR_BOUND,
    Relation.PREFIX,
    Relation.STATE_INITIAL,
    Relation.SAME_LEAF,
    Relation.SAME_PATH,
)
"""The relations a constant may take to one drawn before it (half the constants take none: independent)."""
CONTENT = (
    Relation.BYTES_OTHER_DTYPE,
    Relation.BYTES_OTHER_SHAPE,
    Relation.REORDERED,
    Relation.NEAR_BOUND,
    Relation.NEAR_1E4,
    Relation.NEAR_1E3,
    Relation.NEAR_1E2,
    Relation.NEAR_1E1,
    Relation.PREFIX,
    Relation.STATE_INITIAL,
    Relation.EQUAL,
)
"""The relations of a constant's values to another's, in the order one that fits nothing gives way: the
rarely fitting first, then near-equal from the finest (what a closeness test takes for equal), equal last."""

NUDGES = {
    Relation.NEAR_1E1: 2**-4,
    Relation.NEAR_1E2: 2**-8,
    Relation.NEAR_1E3: 5e-4,
    Relation.NEAR_1E4: 5e-5,
    Relation.NEAR_BOUND: 4e-6,
}
"""How far a near-equal constant's elements move (``Constant.nudge``) for each magnitude. The coarser ones
move a few elements near the end, where a digest of a prefix or a sample of the bytes does not reach; the
finer ones (a fine-tuned weight) move every element, which moves a weighted sum of n of them by the nudge
times about ``sqrt(n)`` of its size: past the float32 comparison bound (``1e-5 * (1 + |e|)``) down to
``NEAR_BOUND``'s, where a closeness test at 1e-5 still calls the two one tensor."""
VISIBLE_AT_BOUND = 64
"""The fewest elements a tensor moved by ``NEAR_BOUND``'s nudge has for the move to show: every element by
4e-6 moves a weighted sum of n by about ``4e-6 * 0.9 * sqrt(n)`` of it, past the float32 bound from 64 on."""
EVERY_ELEMENT_BELOW = 1e-3
"""A nudge under this moves every element; one at or above it, a few."""

ZEROS_UP_TO = 16
"""The most elements a zero tensor is drawn with: its values are written out in the program."""
BITS_FROM = {"int32": ("float32",), "int16": ("float16", "bfloat16"), "float16": ("bfloat16",)}
"""The dtypes whose bytes a constant of each dtype may hold: a float's bytes as an integer or as another
float of its size, never an integer's as a float (the patterns of negative integers are NaNs)."""
BITS_FROM["bfloat16"] = ("float16",)
_VALUED = TENSOR_FAMILIES
"""The families whose values a relation may choose: the others' values are in the graph (a new graph each)."""


@dataclass(frozen=True)
class _Related:
    """How one constant relates to those drawn before it: a ``RELATED`` entry or None (independent), which
    earlier constant (an index into the candidates that fit) and, nudged near the end, how far from it."""

    relation: Relation | None
    like: int
    nudges: tuple[int, ...]


@st.composite
def _related(draw: st.DrawFn) -> _Related:
    relation = draw(st.sampled_from(RELATED)) if draw(st.booleans()) else None
    nudges = tuple(draw(st.lists(st.integers(0, 63), min_size=1, max_size=3, unique=True)))
    return _Related(relation, draw(st.integers(0, 7)), nudges)


@dataclass(frozen=True)
class _Drawn:
    name: str
    shape: MethodShape
    paths: tuple[str, ...]
    seeds: tuple[int, ...]
    related: tuple[_Related, ...]


@st.composite
def _drawn_method(draw: st.DrawFn, max_constants: int, stateful: bool, prefixes: tuple[str, ...]) -> _Drawn:
    name = METHOD_NAMES[draw(st.integers(0, len(METHOD_NAMES) - 1))]
    fitting = [s for s in METHOD_SHAPES if len(s.slots) <= max_constants and (stateful or not s.states)]
    shape = fitting[draw(st.integers(0, len(fitting) - 1))]
    n = len(shape.slots)
    leaves = draw(st.lists(st.sampled_from(NAMES), min_size=n, max_size=n))
    paths = tuple(leaf if leaf.startswith("_") else prefixes[i] + leaf for i, leaf in enumerate(leaves))
    seeds = tuple(draw(st.integers(0, 3)) for _ in range(n))
    return _Drawn(name, shape, paths, seeds, tuple(draw(_related()) for _ in range(n)))


@st.composite
def _root_constants(draw: st.DrawFn) -> tuple[Constant, ...]:
    """The shared root, named: a path for each weight, and one leaf for the two layers' state."""
    prefixes = ROOT_PATHS[draw(st.integers(0, len(ROOT_PATHS) - 1))]
    leaves = draw(st.lists(st.sampled_from(NAMES), min_size=2, max_size=2, unique=True))
    state = draw(st.sampled_from([n for n in NAMES if not n.startswith("_") and n not in leaves]))
    style = LAYER_STYLES[draw(st.integers(0, len(LAYER_STYLES) - 1))]
    names = [p + leaf if not leaf.startswith("_") else leaf for p, leaf in zip(prefixes, leaves, strict=True)]
    names += [style.format(i=i, leaf=state) for i in range(len(STATE_PER_LAYER))]
    root = [replace(c, name=n, seed=draw(st.integers(0, 3))) for c, n in zip(ROOT, names, strict=True)]
    if draw(st.booleans()):  # a fresh KV cache: every layer's state starts at zero
        for i in STATE_PER_LAYER:
            root[i] = replace(root[i], values=(0.0,) * _numel(root[i].shape))
    return tuple(root)


@st.composite
def program_specs(
    draw: st.DrawFn, max_methods: int = 4, max_constants: int = 3, max_calls: int = 6, stateful: bool = True
) -> ProgramSpec:
    """A program of colliding names; ``stateful=False``: no method writes state (for a backend that keeps
    none between calls), its methods drawn from the shapes that only read."""
    shared = draw(_root_constants()) if draw(st.booleans()) else ()
    prefixes = PATHS[draw(st.integers(0, len(PATHS) - 1))]
    # Methods are drawn as one list (name and body together) so the shrinker can delete any of them, not
    # only the last.
    drawn = draw(
        st.lists(
            _drawn_method(max_constants, stateful, prefixes),
            unique_by=lambda m: m.name,
            min_size=min(2, max_methods),
            max_size=max_methods,
        )
    )
    methods = [_resolve(m, shared) for m in drawn]
    related = [
        [
            r
            for slot, r in zip(m.shape.slots, m.related, strict=True)
            if not (shared and slot.root is not None)
        ]
        for m in drawn
    ]
    methods = _with_relations(methods, related, shared)
    names = [m.name for m in methods]
    calls = draw(st.lists(st.sampled_from(names), max_size=max_calls))
    calls += [m for m in names if m not in calls]  # every method runs at least once
    return ProgramSpec(methods=tuple(methods), shared=shared, calls=tuple(calls))


def _resolve(m: _Drawn, shared: tuple[Constant, ...]) -> Method:
    """``m`` as a method of a program with the shared root ``shared``. Without a root, a root slot is the
    method's own constant; own state is named for its method (``<method>_state``, one per layer where it
    writes two), a name no other method uses; an own path that another slot or a root constant the method
    reads has already, or that is a module of another's, takes the next free leaf."""
    read_roots = {shared[s.root].name for s in m.shape.slots if shared and s.root is not None}
    taken = set(read_roots)
    own: list[Constant] = []
    reads: list[str] = []
    names: list[str] = []
    states = [s for s in m.shape.states if not (shared and s.root is not None)]
    for slot, path, seed in zip(m.shape.slots, m.paths, m.seeds, strict=True):
        if shared and slot.root is not None:
            names.append(shared[slot.root].name)
            continue
        if slot in states:
            path = f"{m.name}_state" if len(states) == 1 else f"layers.{states.index(slot)}.{m.name}_state"
        path = _free(path, taken)
        taken.add(path)
        names.append(path)
        tied = names[slot.tied] if slot.tied is not None else None
        own.append(replace(slot.constant, name=path, seed=0 if tied else seed, tied=tied))
    by_slot = dict(zip(m.shape.slots, names, strict=True))
    reads = [by_slot[s] for s in m.shape.reads]
    writes = tuple(Write(by_slot[s], m.shape.op) for s in m.shape.states)
    return Method(m.name, tuple(own), reads=tuple(reads), writes=writes)


def _prefix(path: str) -> str:
    """The modules of ``path``: ``layers.0.`` of ``layers.0.weight``."""
    return path[: len(path) - len(path.rpartition(".")[2])]


def _free(path: str, taken: set[str]) -> str:
    """``path``, or the first path of its prefix and another leaf that no other constant of the method has and
    that is no module of one (and has none)."""
    prefix = _prefix(path)
    for candidate in (path, *(prefix + leaf for leaf in NAMES)):
        if candidate not in taken and not any(_nests(candidate, t) for t in taken):
            return candidate
    raise AssertionError(
        f"no free name for {path!r} among {sorted(taken)}"
    )  # NAMES outnumber a method's slots


def _nests(a: str, b: str) -> bool:
    """Whether one of two paths is a module of the other (``w`` and ``w.bias``)."""
    return a.startswith(f"{b}.") or b.startswith(f"{a}.")


def _with_relations(
    methods: list[Method], related: list[list[_Related]], shared: tuple[Constant, ...]
) -> list[Method]:
    """``methods`` with each own constant related as drawn (``related``: one per own constant, in order) to
    one drawn before it: first the names (the same leaf under another prefix, the same path as another
    method's constant), then the values. A relation nothing earlier fits, or that would make a lookalike of
    a constant of the same leaf, leaves the seed's draw; zeros take a leaf, and a dtype and shape, no other
    tensor of the program has (bound in another's place, they would read as that tensor zero-filled)."""
    written = {w.target for m in methods for w in m.writes}
    named = _with_names(methods, related, shared, written)
    every = [*shared, *(c for m in named for c in m.constants)]
    leaves = {c.leaf: sum(e.leaf == c.leaf for e in every) for c in every}
    kinds = {(c.dtype, c.shape): sum((e.dtype, e.shape) == (c.dtype, c.shape) for e in every) for c in every}
    earlier: list[tuple[Constant, bool]] = [(c, c.name in written) for c in shared]
    out = []
    for m, drawn in zip(named, related, strict=True):
        own = []
        for c, r in zip(m.constants, drawn, strict=True):
            state = any(w.target == c.name for w in m.writes)
            if c.family in _VALUED and c.tied is None:
                valued = _valued(c, state, r, earlier)
                if _zeros(valued) and not state and (leaves[c.leaf] > 1 or kinds[c.dtype, c.shape] > 1):
                    valued = c  # bound in another's place, zeros read as that tensor zero-filled
                if not any(e.leaf == c.leaf and _confusable(valued, e) for e, _ in earlier):
                    c = valued
                for e, _ in earlier:  # beside a same-leaf lookalike: its zeros too, or a seed apart
                    if e.leaf == c.leaf and e.tied is None and _confusable(c, e):
                        c = _drawn_like(c, e) if _same_kind(c, e) else _seeded_apart(c, earlier)
            own.append(c)
            earlier.append((c, state))
        out.append(replace(m, constants=tuple(own)))
    return out


def _with_names(
    methods: list[Method], related: list[list[_Related]], shared: tuple[Constant, ...], written: set[str]
) -> list[Method]:
    """``methods`` with the names their constants' name relations draw: the leaf of a constant drawn before
    under another prefix (``SAME_LEAF``), or another method's path (``SAME_PATH``), where the method has
    that path free; state and tied tensors keep theirs."""
    earlier: list[tuple[str, Constant]] = [("", c) for c in shared]
    out = []
    for m, drawn in zip(methods, related, strict=True):
        taken = {c.name for c in m.constants} | {n for n in m.reads if m.private(n) is None}
        tied = {c.tied for c in m.constants if c.tied is not None}
        names: dict[str, str] = {}
        for c, r in zip(m.constants, drawn, strict=True):
            fixed = c.name in written or c.tied is not None or c.name in tied or c.family == "scalar"
            if r.relation in (Relation.SAME_LEAF, Relation.SAME_PATH) and not fixed:
                others = taken - {c.name}
                prefix = _prefix(c.name)
                if r.relation == Relation.SAME_PATH:  # another method's path under this one's prefix
                    fits = [
                        e.name
                        for owner, e in earlier
                        if owner not in ("", m.name) and _prefix(e.name) == prefix
                    ]
                else:  # a leaf drawn before under another prefix, this one's
                    fits = [prefix + e.leaf for _, e in earlier if _prefix(e.name) != prefix]
                fits = [n for n in fits if n not in written]
                fits = [n for n in fits if n not in others and not any(_nests(n, t) for t in others)]
                if fits:
                    names[c.name] = fits[r.like % len(fits)]
                    taken = others | {names[c.name]}
            earlier.append((m.name, c))
        out.append(_renamed(m, names) if names else m)
    return out


def _renamed(m: Method, names: dict[str, str]) -> Method:
    """``m`` with its own constants renamed ``old -> new``, its reads following."""
    return replace(
        m,
        constants=tuple(replace(c, name=names.get(c.name, c.name)) for c in m.constants),
        reads=tuple(names.get(r, r) for r in m.reads),
    )


def _valued(c: Constant, state: bool, r: _Related, earlier: list[tuple[Constant, bool]]) -> Constant:
    """``c`` with its values drawn as its content relation ``r`` says, from a constant of ``earlier`` that
    fits it (of another leaf: a pair of one leaf that only looks alike would be by-name and lookalike). A
    relation no earlier constant fits gives way to the next of ``CONTENT`` that one does: most pairs fit few
    relations (bytes under another dtype need a float of the shape drawn first), which drawn blindly would
    almost never be tried."""
    n = _numel(c.shape)
    if r.relation == Relation.ZEROS:
        return replace(c, values=(0.0,) * n) if n <= ZEROS_UP_TO else c
    if r.relation not in CONTENT:
        return c
    start = CONTENT.index(r.relation)
    for relation in CONTENT[start:] + CONTENT[:start]:
        fits = [e for e, written in earlier if _fits(relation, c, state, e, written)]
        if fits:
            break
    else:
        return c
    e = fits[r.like % len(fits)]
    if relation == Relation.BYTES_OTHER_DTYPE:
        return replace(c, seed=e.seed, values=e.values, drawn_as=e.dtype)
    if relation == Relation.BYTES_OTHER_SHAPE:
        return replace(c, seed=e.seed, values=e.values, drawn_as=e.drawn_as)
    like = _drawn_like(c, e)
    if relation == Relation.REORDERED:
        return replace(like, reordered=not e.reordered)
    if relation == Relation.PREFIX:
        return replace(like, nudged_from=(n + 1) // 2, nudge=0.5)
    if relation in NUDGES:
        nudge = NUDGES[relation]
        if nudge < EVERY_ELEMENT_BELOW:
            return replace(like, nudged_from=0, nudge=nudge)
        return replace(like, nudged=tuple(sorted({n - 1 - d % n for d in r.nudges})), nudge=nudge)
    return like  # equal, or a constant equal to a state's initial value


def _fits(relation: Relation, c: Constant, state: bool, e: Constant, written: bool) -> bool:
    """Whether ``e``, drawn before ``c``, can be the other tensor of ``relation`` with ``c``."""
    if e.family not in _VALUED or e.tied is not None or e.leaf == c.leaf:
        return False
    plain = not (e.moved or e.reordered)
    if relation == Relation.BYTES_OTHER_DTYPE:
        return e.dtype in BITS_FROM.get(c.dtype, ()) and e.shape == c.shape and plain and not e.drawn_as
    if relation == Relation.BYTES_OTHER_SHAPE:
        return e.dtype == c.dtype and e.shape != c.shape and _numel(e.shape) == _numel(c.shape) and plain
    if not _same_kind(c, e):
        return False
    if relation == Relation.STATE_INITIAL:
        return state != written
    if relation == Relation.REORDERED:
        return len(c.shape) >= 2 and c.shape[-1] == c.shape[-2] and not e.moved
    if relation == Relation.NEAR_BOUND:  # over fewer elements, a move this fine stays within the bound
        return plain and _numel(c.shape) >= VISIBLE_AT_BOUND
    if relation in (Relation.PREFIX, *NUDGES):
        return plain and _numel(c.shape) >= 2
    return True  # equal


def _seeded_apart(c: Constant, earlier: list[tuple[Constant, bool]]) -> Constant:
    """``c`` drawn from a seed no earlier constant has: one seed under two shapes of one element count gives
    one byte pattern twice, which beside a same leaf reads as by-name and lookalike at once."""
    return replace(c, seed=1 + max(e.seed for e, _ in earlier))


def _drawn_like(c: Constant, e: Constant) -> Constant:
    """``c`` holding what ``e`` holds: its fields that decide the values."""
    return replace(
        c,
        seed=e.seed,
        values=e.values,
        drawn_as=e.drawn_as,
        nudged=e.nudged,
        nudged_from=e.nudged_from,
        nudge=e.nudge,
        reordered=e.reordered,
    )


def _same_kind(a: Constant, b: Constant) -> bool:
    return (a.dtype, a.shape) == (b.dtype, b.shape)


def _confusable(a: Constant, b: Constant) -> bool:
    """Whether two drawn constants hold tensors that differ but look alike to a check of less than their
    content (pytest_ptn.programs.survey.looks_alike), or are zeros beside a tensor of their dtype and shape,
    which a binding of the zeros in the other's place could not tell from zero-filling it. A tied one is
    its source's tensor, which is compared in its place."""
    if a.tied is not None or b.tied is not None:
        return False
    if _zeros(a) != _zeros(b) and _same_kind(a, b):
        return True
    if _same_kind(a, b) and _drawn_like(a, b) == a:
        return False
    if (
        not _same_kind(a, b)
        and _numel(a.shape) * ELEMENT_SIZES[a.dtype] != _numel(b.shape) * ELEMENT_SIZES[b.dtype]
    ):
        return False
    from pytest_ptn.programs.build import make_tensor
    from pytest_ptn.programs.survey import looks_alike

    return looks_alike(make_tensor(a), make_tensor(b))


def _zeros(c: Constant) -> bool:
    return c.values is not None and not any(c.values) and not c.moved


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
