"""What a multi-method program's constants and state are like, read from its exported programs as data: the
structure real programs hold (nested paths whose leaves repeat across layers and methods, state per layer,
tied and non-contiguous tensors, dtype mixes, ...) and how its tensors relate to each other, pair by pair
(``Relation``: one lattice, from independent to equal).

It is read the same way from upstream's models (the zoo, optimum's exports), from the catalogue and from the
fuzz's generated programs, so a test can hold the generator to what real programs are (tests/test_survey.py)
and a fuzz run can say which of them its programs exercised (its coverage line)."""

from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import combinations
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the lattice is read without torch (pytest_ptn.strategies draws from it)
    import torch
    from torch.export import ExportedProgram

    from pytest_ptn.spec import ProgramSpec

LONG_BYTES = 1024
"""A constant longer than this is ``long``: past what a digest of a prefix reads."""


class Property(enum.StrEnum):
    """A structural property of a program's constants and state."""

    NESTED = "nested paths"
    """A constant three or more parts deep (``layers.0.weight``): it lives on a nested submodule."""
    LEAF_IN_LAYERS = "a leaf in several layers"
    """One method holds two tensors of other content under paths that end in one leaf name."""
    LEAF_ACROSS_METHODS = "a leaf in several methods"
    """Two methods hold tensors of other content under other paths that end in one leaf name."""
    PATH_ACROSS_METHODS = "a path in several methods"
    """Two methods hold a tensor under one path (one weight, or two that collide)."""
    COLLIDING_PATH = "one path, other tensors"
    """Two methods hold other tensors under one path."""
    STATE_PER_LAYER = "state per layer"
    """Written buffers whose paths differ in their numbers only (``layers.0.k_cache``, ``key_cache_1``)."""
    SHARED_STATE = "shared state"
    """A buffer written by one method that another method binds."""
    PRIVATE_STATE = "private state"
    """A buffer written by a method that no other method binds."""
    TIED = "tied tensors"
    """One storage under two names (an output layer tied to the embedding, a module on two paths)."""
    NON_CONTIGUOUS = "non-contiguous"
    """A tensor whose strides are not row-major (a transposed view)."""
    VIEW = "a view into a larger storage"
    """A tensor that is part of its storage: an offset, or other values beside it."""
    INTEGER = "integer tensors"
    BOOL = "bool tensors"
    REDUCED_FLOAT = "bf16 or fp16 tensors"
    DTYPE_MIX = "several dtypes in one method"
    QUANTIZED = "quantized weights"
    """An int8 or uint8 tensor beside floating tensors in one method (weights with their scales)."""
    SCALAR = "0-d tensors"
    HIGH_RANK = "rank 3 or more"
    NON_PERSISTENT = "non-persistent buffers"
    LONG = "over 1 KiB"


class Relation(enum.StrEnum):
    """How two tensors of a program relate: the lattice the fuzz draws from (docs/fuzzing.md), from the
    weakest tie to the strongest. A pair gets the first that holds, content relations before names."""

    INDEPENDENT = "independent"
    EQUAL = "equal"
    """The same dtype, shape and bytes under two names or in two methods."""
    BYTES_OTHER_DTYPE = "same bytes, other dtype"
    BYTES_OTHER_SHAPE = "same bytes, other shape"
    ZEROS = "both zeros"
    """Two zero tensors of other sizes (fresh caches; zeros of one size are one byte pattern)."""
    REORDERED = "same elements, other order"
    """A square weight and its transpose: one multiset of values."""
    NEAR_1E1 = "near-equal within 1e-1"
    NEAR_1E2 = "near-equal within 1e-2"
    NEAR_1E3 = "near-equal within 1e-3"
    NEAR_1E4 = "near-equal within 1e-4"
    NEAR_BOUND = "near-equal within 1e-5"
    """Every element within this of the other's, relative to ``max(|x|, 1)``, one at least beyond 1e-6."""
    PREFIX = "equal prefix"
    """The same dtype and shape, the first half of the bytes or more equal, the rest not."""
    SAME_LEAF = "same leaf name"
    """Other paths that end in one leaf name, other content."""
    SAME_PATH = "same path in another method"
    """One path in two methods, other content."""
    STATE_INITIAL = "a constant equal to a state's initial value"


EVERY: tuple[str, ...] = (*Property, *(r for r in Relation if r != Relation.INDEPENDENT))
"""Every property and relation a program can hold, in order: what a fuzz run's coverage line is told in."""

NEAR = (
    (Relation.NEAR_BOUND, 1e-5),
    (Relation.NEAR_1E4, 1e-4),
    (Relation.NEAR_1E3, 1e-3),
    (Relation.NEAR_1E2, 1e-2),
    (Relation.NEAR_1E1, 1e-1),
)
"""The near-equal relations by the largest relative difference they admit, finest first."""


@dataclass(frozen=True)
class Held:
    """One tensor a method binds: its key, whether some method writes it, and whether it is a persistent
    buffer, a non-persistent one or no buffer."""

    method: str
    key: str
    tensor: torch.Tensor
    written: bool
    buffer: bool = False
    persistent: bool = True

    @property
    def leaf(self) -> str:
        return self.key.rpartition(".")[2]


@dataclass
class Survey:
    """What a program (or several) holds: each property and relation with how many times it was seen, and
    the deepest path."""

    properties: Counter[Property] = field(default_factory=Counter)
    relations: Counter[Relation] = field(default_factory=Counter)
    depth: int = 0
    """Parts of the longest constant path (``layers.0.weight``: 3)."""

    def __ior__(self, other: Survey) -> Survey:
        self.properties.update(other.properties)
        self.relations.update(other.relations)
        self.depth = max(self.depth, other.depth)
        return self

    @property
    def found(self) -> frozenset[Property | Relation]:
        """Every property and relation seen, as one set (relations other than independent)."""
        return frozenset(self.properties) | frozenset(self.relations) - {Relation.INDEPENDENT}


def held(programs: Mapping[str, ExportedProgram]) -> list[Held]:
    """Every constant and buffer each method binds (exported programs, functional or not)."""
    from torch.export.graph_signature import InputKind

    from pytest_ptn.programs.exported import constants_of

    written = {key for ep in programs.values() for key in written_buffers(ep)}
    out = []
    for method, ep in programs.items():
        buffers = {
            s.target: s.persistent is not False
            for s in ep.graph_signature.input_specs
            if s.kind == InputKind.BUFFER and s.target is not None
        }
        for key, use in constants_of(ep).items():
            out.append(Held(method, key, use.tensor, key in written, key in buffers, buffers.get(key, True)))
    return out


def held_by(spec: ProgramSpec) -> list[Held]:
    """What ``held`` reads of ``spec``'s exported programs, read from the spec without exporting it: each
    method's own tensors and the shared root's (under each of the root's paths), as programs.build holds
    them, and its literals as export lifts them (``lifted_tensor_<i>``, in the order the method makes them).
    A linear layer's weights are left out (a program of vectors, which the fuzz never draws)."""
    from pytest_ptn.programs.build import make_tensor, tensors
    from pytest_ptn.spec import SHARED

    written = {
        w.target if m.private(w.target) else f"{SHARED}.{w.target}" for m in spec.methods for w in m.writes
    }
    shared = tensors(spec.shared)
    roots = [SHARED, *([spec.shared_alias] if spec.shared_alias is not None else [])]
    out = []
    for m in spec.methods:
        own = tensors(m.constants)
        for c in m.constants:
            if c.name in own:
                out.append(
                    Held(m.name, c.name, own[c.name], c.name in written, c.family == "buffer", c.persistent)
                )
        literals = [own_c for name in m.reads if (own_c := m.private(name)) and own_c.family == "literal"]
        out += [Held(m.name, f"lifted_tensor_{i}", make_tensor(c), False) for i, c in enumerate(literals)]
        for root in roots:
            for c in spec.shared:  # a plain tensor attribute is in a method's export where it reads it
                read = c.name in m.reads and m.private(c.name) is None
                if c.name in shared and (c.family != "attribute" or read):
                    key = f"{root}.{c.name}"
                    out.append(
                        Held(
                            m.name,
                            key,
                            shared[c.name],
                            f"{SHARED}.{c.name}" in written,
                            c.family == "buffer",
                            c.persistent,
                        )
                    )
    return out


def written_buffers(ep: ExportedProgram) -> set[str]:
    """The buffers ``ep`` writes: its signature's mutations where it is functional, else the buffers an
    in-place operator of its graph writes (``torch.export.export``'s own graph, before decomposition)."""
    import torch
    from torch.export.graph_signature import InputKind

    out = set(ep.graph_signature.buffers_to_mutate.values())
    buffers = {s.arg.name: s.target for s in ep.graph_signature.input_specs if s.kind == InputKind.BUFFER}
    for node in ep.graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        for arg, declared in zip(node.args, schema.arguments if schema is not None else (), strict=False):
            writes = declared.alias_info is not None and declared.alias_info.is_write
            if writes and isinstance(arg, torch.fx.Node) and arg.name in buffers:
                out.add(buffers[arg.name])
    return out


def survey(programs: Mapping[str, ExportedProgram]) -> Survey:
    """The properties and relations of one program (method -> exported program)."""
    return survey_of(held(programs))


def survey_of(items: Iterable[Held]) -> Survey:
    """The properties and relations of one program's tensors."""
    import torch

    items = [i for i in items if type(i.tensor) in (torch.Tensor, torch.nn.Parameter)]  # no subclass
    out = Survey()
    found = out.properties
    for i in items:
        out.depth = max(out.depth, len(i.key.split(".")))
        t = i.tensor
        found.update(_tensor_properties(i))
        if t.dim() and (not t.is_contiguous()):
            found[Property.NON_CONTIGUOUS] += 1
        if t.numel() and (t.storage_offset() or t.untyped_storage().nbytes() > t.numel() * t.element_size()):
            found[Property.VIEW] += 1
    for method in dict.fromkeys(i.method for i in items):
        own = [i for i in items if i.method == method]
        if len({i.tensor.dtype for i in own}) > 1:
            found[Property.DTYPE_MIX] += 1
        if any(i.tensor.dtype in (torch.int8, torch.uint8) for i in own) and any(
            i.tensor.is_floating_point() for i in own
        ):
            found[Property.QUANTIZED] += 1
    written = [i for i in items if i.written]
    binders: dict[str, set[str]] = {}
    for i in items:
        binders.setdefault(i.key, set()).add(i.method)
    for key in {i.key for i in written}:
        found[Property.SHARED_STATE if len(binders[key]) > 1 else Property.PRIVATE_STATE] += 1
    layers = Counter(_unnumbered(key) for key in {i.key for i in written})
    per_layer = sum(n for n in layers.values() if n > 1)
    if per_layer:
        found[Property.STATE_PER_LAYER] += per_layer
    facts: dict[int, _Facts] = {}
    for a, b in combinations(_distinct(items), 2):
        if a.key == b.key:
            found[Property.PATH_ACROSS_METHODS] += 1
            if a.tensor is b.tensor:
                continue  # one tensor that two methods bind
        elif _one_storage(a.tensor, b.tensor):
            found[Property.TIED] += 1
            continue
        for relation in _relations(a, b, facts):
            out.relations[relation] += 1
            names = _names_property(a, b, relation)
            if names is not None:
                found[names] += 1
    return out


def _tensor_properties(i: Held) -> Iterable[Property]:
    import torch

    t = i.tensor
    if len(i.key.split(".")) >= 3:
        yield Property.NESTED
    if t.dtype == torch.bool:
        yield Property.BOOL
    elif not (t.is_floating_point() or t.is_complex()):
        yield Property.INTEGER
    elif t.dtype in (torch.bfloat16, torch.float16):
        yield Property.REDUCED_FLOAT
    if t.dim() == 0:
        yield Property.SCALAR
    if t.dim() >= 3:
        yield Property.HIGH_RANK
    if i.buffer and not i.persistent:
        yield Property.NON_PERSISTENT
    if t.numel() * t.element_size() > LONG_BYTES:
        yield Property.LONG


def _distinct(items: list[Held]) -> list[Held]:
    """One item per (method, key); a tensor bound by several methods under one key (the shared root) is
    one item per method, which the pair of them relates by its path alone."""
    return list({(i.method, i.key): i for i in items}.values())


def _one_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors (under two keys) are one storage: tied, or one module on two paths."""
    return (
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.untyped_storage().nbytes() > 0
    )


def _relations(a: Held, b: Held, facts: dict[int, _Facts]) -> list[Relation]:
    """How ``a`` and ``b`` relate: their content's relation (the first of the lattice that holds), then
    what their names and roles add."""
    content = _relation(*(facts.setdefault(id(i.tensor), _Facts(i.tensor)) for i in (a, b)))
    out = [content]
    if content == Relation.EQUAL and a.written != b.written:
        out.append(Relation.STATE_INITIAL)
    if content != Relation.EQUAL:
        if a.key == b.key and a.method != b.method:
            out.append(Relation.SAME_PATH)
        elif a.key != b.key and a.leaf == b.leaf:
            out.append(Relation.SAME_LEAF)
    return out


def _names_property(a: Held, b: Held, relation: Relation) -> Property | None:
    if relation == Relation.SAME_PATH:
        return Property.COLLIDING_PATH
    if relation == Relation.SAME_LEAF:
        return Property.LEAF_IN_LAYERS if a.method == b.method else Property.LEAF_ACROSS_METHODS
    return None


LOOKALIKES = frozenset(
    {
        Relation.BYTES_OTHER_DTYPE,
        Relation.BYTES_OTHER_SHAPE,
        Relation.REORDERED,
        *(relation for relation, _ in NEAR),
        Relation.PREFIX,
    }
)
"""The content relations of two different tensors that a check of less than their full content takes for
one: bytes without dtype or shape, a sum or a sorted digest, closeness, a digest of a prefix."""

FEW = 4
"""Two tensors of one dtype and shape differing in at most one element in ``FEW`` (or in at most three, but
not all) look alike too, by however much: what a digest of a sample of the bytes takes for one."""


def looks_alike(mine: torch.Tensor, theirs: torch.Tensor) -> bool:
    """Whether ``theirs`` differs from ``mine`` but looks the same to a check of less than the full content:
    a relation of ``LOOKALIKES``, or the same dtype and shape with few elements that differ."""
    relation = relation_of(mine, theirs)
    if relation in LOOKALIKES:
        return True
    if relation != Relation.INDEPENDENT or (mine.dtype, mine.shape) != (theirs.dtype, theirs.shape):
        return False
    differ = int((mine.reshape(-1) != theirs.reshape(-1)).sum())
    return 0 < differ <= max(min(3, mine.numel() - 1), mine.numel() // FEW)


def relation_of(a: torch.Tensor, b: torch.Tensor) -> Relation:
    """The content relation of two tensors (``Relation``, names aside): the lattice's first that holds."""
    return _relation(_Facts(a), _Facts(b))


class _Facts:
    """What relating a tensor to others reads of it, each read once: a program's tensors are related pair
    by pair, so each would otherwise be hashed and copied once per pair."""

    def __init__(self, t: torch.Tensor):
        self.tensor = t
        self.meta = (t.dtype, tuple(t.shape))
        self.nbytes = t.numel() * t.element_size()
        self._bytes: bytes | None = None
        self._zero: bool | None = None

    @property
    def bytes(self) -> bytes:
        if self._bytes is None:
            from pytest_ptn.instruments.content import tensor_bytes

            self._bytes = bytes(tensor_bytes(self.tensor))
        return self._bytes

    @property
    def zero(self) -> bool:
        if self._zero is None:
            self._zero = bool(self.tensor.numel()) and not bool(self.tensor.any())
        return self._zero


def _relation(fa: _Facts, fb: _Facts) -> Relation:
    a, b = fa.tensor, fb.tensor
    same_meta = fa.meta == fb.meta
    if fa.nbytes == fb.nbytes and fa.nbytes and fa.bytes == fb.bytes:
        if same_meta:
            return Relation.EQUAL
        return Relation.BYTES_OTHER_DTYPE if a.dtype != b.dtype else Relation.BYTES_OTHER_SHAPE
    if fa.zero and fb.zero:
        return Relation.ZEROS
    if not same_meta or not a.numel():
        return Relation.INDEPENDENT
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    if a.dim() >= 2 and a.shape[-1] == a.shape[-2] and a.transpose(-2, -1).equal(b):
        return Relation.REORDERED
    if a.is_floating_point():
        wa, wb = flat_a.double(), flat_b.double()
        finite = bool(wa.isfinite().all() and wb.isfinite().all())
        moved = float(((wa - wb).abs() / wb.abs().clamp(min=1.0)).max()) if finite else float("inf")
        for relation, bound in NEAR:
            if moved <= bound:
                return relation
    differ = (flat_a != flat_b).nonzero()
    if len(differ) and int(differ[0]) >= (flat_a.numel() + 1) // 2:
        return Relation.PREFIX
    return Relation.INDEPENDENT


_NUMBER = re.compile(r"\d+")


def _unnumbered(key: str) -> str:
    """A key with its numbers left out: ``layers.#.k_cache``, ``key_cache_#``."""
    return _NUMBER.sub("#", key)
