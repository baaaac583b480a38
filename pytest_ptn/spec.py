"""Multi-method programs described as plain data, so scenarios, fuzzers and reproducers share one type.

Nothing here imports torch: the catalogue is read at collection time, before any backend is touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

SHARED = "shared"
"""Owner of constants that live on the root module and so keep one FQN (``shared.<name>``) in every method."""

FAMILIES = ("parameter", "buffer", "attribute", "literal", "scalar", "int8_linear", "linear")
"""How a constant enters the program, and so which name the toolchain gives it:

- ``parameter``/``buffer``: registered on a module, named by FQN (``w``, ``shared.kv``);
- ``attribute``: a plain tensor attribute, a ``CONSTANT_TENSOR`` named by attribute (``_tensor_constant0``);
- ``literal``: ``torch.tensor(...)`` built in ``forward``, minted ``lifted_tensor_<i>`` per method;
- ``scalar``: a Python float in ``forward``, lifted by ExecuTorch to ``_lifted_tensor_constant<i>``;
- ``int8_linear``: a bias-free ``nn.Linear`` of shape (out, in) quantized by torchao's int8 weight-only
  config, so its constants are ``<name>.parametrizations.weight.original0..2`` (int8 data, scale, zero point);
  reading it applies it to ``x``;
- ``linear``: a float ``nn.Linear`` of shape (out, in) with a bias, in a program of ``vectors``: a backend
  that quantizes (Capability.QUANTIZE) folds its weight per method into ``_frozen_param<i>``, with
  ``_scale_<i>``/``_zero_point_<i>``; reading it applies it to ``x``.
"""
TENSOR_FAMILIES = ("parameter", "buffer", "attribute")
"""The families registered as a tensor of the module itself (not a child module, not made in forward)."""

WRITE_OPS = ("add", "copy", "index_copy", "shift")
LAYOUTS = ("contiguous", "transposed", "strided", "offset")
"""How a constant's tensor lies in memory (``Constant.layout``), as real programs hold their weights:

- ``contiguous``: row-major, at the start of a storage of its own;
- ``transposed``: its last two dimensions swapped in memory (strides swapped), as a weight stored as another
  weight's transpose (``lm_head`` as the embedding's ``.t()``);
- ``strided``: every other element of a storage twice as long in its last dimension (stride 2), the others
  holding other values, as one half of an interleaved pair;
- ``offset``: a slice starting past other values of its storage, as ``wq`` cut from a fused ``wqkv``.

A packer or a digest that reads the storage rather than the tensor (its data pointer and element count,
ignoring strides and offset) reads other values than the program does."""
VIEW_LAYOUTS = ("strided", "offset")
"""The layouts whose storage holds more than the tensor: the values beside it are not the tensor's."""
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
"""What a program may compute in (ProgramSpec.dtype)."""


ELEMENT_SIZES = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "float32": 4,
    "int64": 8,
    "float64": 8,
}
"""Bytes per element of each dtype a constant may have: one bit pattern read as two dtypes needs one size."""


@dataclass(frozen=True)
class Constant:
    """A tensor a method reads. ``values`` (flattened) wins over ``seed`` when given.

    ``name`` is its path from the module that owns it (the method's, or the shared root): a dotted path
    (``layers.0.attention.wq``) puts it on nested submodules, as every transformer holds its weights, so one
    leaf name repeats across layers and methods.

    ``drawn_as``, ``nudged`` and ``reordered`` make the tensors content-sharing bugs confuse, compactly: the
    bytes of another dtype's draw (a float32 tensor's bit pattern held as int32), a tensor equal to another
    but for some elements moved a little (a fine-tuned method's weight beside the base one), or holding
    another's elements in another order (a square weight and its transpose). ``tied`` and ``layout`` say how
    it lies in memory: another constant's tensor under a second name, and strides or an offset of its own."""

    name: str
    family: str = "buffer"
    dtype: str = "float32"
    shape: tuple[int, ...] = (4,)
    seed: int = 0
    values: tuple[float, ...] | None = None
    persistent: bool = True
    drawn_as: str | None = None
    """The dtype ``seed`` (or ``values``) draws the tensor in, of the same element size, its bytes then read
    as ``dtype``; None: drawn in ``dtype``."""
    nudged: tuple[int, ...] = ()
    """Flat indices of elements moved a little from what the draw gives: ``x + nudge * max(|x|, 1)`` (at
    least the dtype's next value up), ``x + 1`` for an integer: an output changes beyond the comparison
    bound, a closeness test with a tolerance above ``nudge`` calls the tensors equal."""
    nudged_from: int | None = None
    """Every element from this flat index on is moved as ``nudged`` moves its own: 0 moves them all (a
    weight fine-tuned everywhere, by ``nudge``), a later index keeps an equal prefix (what a digest of the
    first bytes sees)."""
    nudge: float = 2**-8
    """How far a moved element moves, relative to ``max(|x|, 1)``."""
    reordered: bool = False
    """The draw's elements in transposed order (its last two dimensions, which are equal): the same values,
    another order, as a square weight beside its transpose."""
    layout: str = "contiguous"
    """How the tensor lies in memory (``LAYOUTS``): its values are the same in every layout."""
    tied: str | None = None
    """The name of another constant of the same owner whose tensor this one is (one storage, two names,
    as an output layer tied to the embedding): its ``layout`` ``transposed`` makes it that tensor's
    transpose, a view of the same storage; its own values are never drawn."""

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem:
            raise ValueError(f"constant {self.name!r}: {problem}")

    def _problem(self) -> str | None:
        n = _numel(self.shape)
        if self.family not in FAMILIES:
            return f"unknown family {self.family!r}, expected one of {FAMILIES}"
        if self.family == "scalar" and self.shape != ():
            return f"a scalar has shape (), not {self.shape}"
        if "" in self.name.split("."):
            return "a path of non-empty names"
        if self.values is not None and len(self.values) != n:
            return f"{len(self.values)} values for shape {self.shape}"
        if self.drawn_as is not None and ELEMENT_SIZES.get(self.drawn_as, 0) != ELEMENT_SIZES.get(self.dtype):
            return (
                f"drawn as {self.drawn_as!r}, read as {self.dtype!r}: one bit pattern needs two dtypes of "
                f"one element size ({ELEMENT_SIZES})"
            )
        if any(not 0 <= i < n for i in self.nudged) or not 0 <= (self.nudged_from or 0) < max(n, 1):
            return f"nudged {self.nudged} (from {self.nudged_from}) outside its {n} elements"
        if not 0 < self.nudge < 1:
            return f"a nudge moves an element by a fraction of it, not {self.nudge}"
        if self.layout not in LAYOUTS:
            return f"unknown layout {self.layout!r}, expected one of {LAYOUTS}"
        if self.layout != "contiguous" and (self.family not in TENSOR_FAMILIES or not self.shape):
            return f"a {self.layout} layout is a tensor's ({TENSOR_FAMILIES}) of rank 1 or more"
        if (self.reordered or self.layout == "transposed") and len(self.shape) < 2:
            return f"transposing needs two dimensions, not {self.shape}"
        if self.reordered and self.shape[-1] != self.shape[-2]:
            return f"reordered needs its last two dimensions equal, not {self.shape}"
        own = (self.seed, self.values, self.drawn_as, self.nudged, self.nudged_from, self.reordered)
        if self.tied is not None and (
            self.family not in TENSOR_FAMILIES
            or self.layout in VIEW_LAYOUTS
            or own != (0, None, None, (), None, False)
        ):
            return (
                f"tied to {self.tied!r}, it is that tensor ({TENSOR_FAMILIES}, contiguous or transposed) and "
                "draws no values of its own"
            )
        return None

    def __repr__(self) -> str:
        """Its name, family and the fields it sets: a reproducer's line stays short as fields are added."""
        given = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)[2:]
            if getattr(self, f.name) != f.default
        ]
        return f"Constant({', '.join([repr(self.name), repr(self.family), *given])})"

    @property
    def moved(self) -> tuple[int, ...]:
        """The flat indices of the elements ``nudged`` and ``nudged_from`` move."""
        start = _numel(self.shape) if self.nudged_from is None else self.nudged_from
        return tuple(sorted({*self.nudged, *range(start, _numel(self.shape))}))

    @property
    def leaf(self) -> str:
        """The last part of its path: ``weight`` of ``layers.0.weight``."""
        return self.name.rpartition(".")[2]


@dataclass(frozen=True)
class Write:
    """An in-place update of a buffer: ``add`` adds ``x.sum()``, ``copy`` fills with it, ``index_copy`` writes
    ``x`` as the row ``argmax(x) % rows`` (a KV-cache update), ``shift`` moves the rows up one and writes
    ``x`` as the last row (a sliding-window KV cache, no 0-d index: the one write of a program of
    ``vectors``)."""

    target: str
    op: str = "add"

    def __post_init__(self) -> None:
        if self.op not in WRITE_OPS:
            raise ValueError(f"write to {self.target!r}: unknown op {self.op!r}, expected one of {WRITE_OPS}")


@dataclass(frozen=True)
class Branch:
    """``torch.cond(x.sum() > 0, ...)`` whose branches each add their own constant (tensor attributes of
    the method's module, so they collide across methods like any other)."""

    on_true: Constant
    on_false: Constant


@dataclass(frozen=True)
class Method:
    """One exported entry point. It applies ``writes`` in order, then returns one value per name in
    ``reads`` (a weighted sum of that tensor plus ``x.sum()``), so a wrong constant shows up at its index."""

    name: str
    constants: tuple[Constant, ...] = ()
    reads: tuple[str, ...] = ()
    writes: tuple[Write, ...] = ()
    input_shape: tuple[int, ...] = (4,)
    mutates_input: bool = False
    branch: Branch | None = None

    def private(self, name: str) -> Constant | None:
        return next((c for c in self.constants if c.name == name), None)


@dataclass(frozen=True)
class ProgramSpec:
    """Methods plus the constants they share (owned by the root, see ``SHARED``) and the calls to make.

    ``dtype`` is what the program computes in: its inputs, and the arithmetic on every constant it reads (a
    bf16 program rounds as a bf16 LLM does). ``shared_alias`` names a second attribute of every method's
    module that holds the shared root too, so each shared tensor has two FQNs (``shared.w``, ``<alias>.w``),
    as llama's ``rope`` hangs off the model and every layer.

    ``vectors``: each method returns its reads as vectors, concatenated (a linear's output, a buffer's rows
    weighted by ``x``), computing no 0-d tensor, as a program of linear layers does: what quantizers expect
    (static int8 XNNPACK cannot lower a 0-d tensor). Its inputs are one row, its writes ``shift``, its
    tensors ``linear``s and 2-d buffers or parameters as wide as the input."""

    methods: tuple[Method, ...]
    shared: tuple[Constant, ...] = ()
    calls: tuple[str, ...] = ()
    seed: int = 0
    dtype: str = "float32"
    shared_alias: str | None = None
    vectors: bool = False

    def __post_init__(self) -> None:
        names = [m.name for m in self.methods]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate method names in {names}")
        shared = {c.name for c in self.shared}
        for c in self.shared:
            if c.family in ("literal", "scalar"):
                raise ValueError(f"shared constant {c.name!r}: a {c.family} lives in one forward, not shared")
        for m in self.methods:
            private = {c.name for c in m.constants}
            if m.branch is not None and {m.branch.on_true.name, m.branch.on_false.name} & private:
                raise ValueError(f"method {m.name!r}: branch constants need names of their own")
            for name in (*m.reads, *(w.target for w in m.writes)):
                if name not in private and name not in shared:
                    raise ValueError(f"method {m.name!r} uses unknown constant {name!r}")
            for w in m.writes:
                target = m.private(w.target) or self.shared_constant(w.target)
                if target is not None and target.family != "buffer":
                    msg = f"method {m.name!r} writes {w.target!r}, a {target.family}, not a buffer"
                    raise ValueError(msg)
        _check_paths("the shared root", self.shared)
        for m in self.methods:
            _check_paths(f"method {m.name!r}", m.constants)
            tied = {
                name for c in (*m.constants, *self.shared) if c.tied is not None for name in (c.name, c.tied)
            }
            if any(w.target in tied for w in m.writes):
                raise ValueError(f"method {m.name!r} writes a tied tensor: state is one tensor of one name")
            self._check_layout(m)
        for call in self.calls:
            if call not in names:
                raise ValueError(f"call to unknown method {call!r}")
        if self.dtype not in FLOAT_DTYPES:
            raise ValueError(f"a program computes in one of {FLOAT_DTYPES}, not {self.dtype!r}")
        if self.shared_alias is not None and (
            not self.shared_alias.isidentifier() or self.shared_alias == SHARED
        ):
            raise ValueError(f"shared_alias {self.shared_alias!r}: an attribute name other than {SHARED!r}")

    def _check_layout(self, m: Method) -> None:
        """``linear`` only in a program of ``vectors``, whose methods take a row, write by ``shift`` only,
        and read tensors as wide as that row (``shift`` needs that too)."""
        constants = [*m.constants, *self.shared]
        if not self.vectors:
            if any(c.family == "linear" for c in constants) or any(w.op == "shift" for w in m.writes):
                raise ValueError(f"method {m.name!r}: a linear or a shift write needs a program of vectors")
            return
        where = f"method {m.name!r} of a program of vectors"
        if len(m.input_shape) != 2 or m.input_shape[0] != 1 or m.mutates_input or m.branch is not None:
            raise ValueError(f"{where}: its input is one row (1, n), not mutated, and it has no branch")
        if any(w.op != "shift" for w in m.writes):
            raise ValueError(f"{where}: writes by shift only (the others compute x.sum(), a 0-d tensor)")
        for name in (*m.reads, *(w.target for w in m.writes)):
            c = m.private(name) or self.shared_constant(name)
            assert c is not None
            if c.family not in ("linear", "buffer", "parameter") or c.shape[1:] != m.input_shape[1:]:
                raise ValueError(f"{where}: {name!r} is a linear, or a buffer or parameter (rows, n)")

    @property
    def call_sequence(self) -> tuple[str, ...]:
        return self.calls or tuple(m.name for m in self.methods)

    def method(self, name: str) -> Method:
        return next(m for m in self.methods if m.name == name)

    def with_other_values(self, offset: int = 1000) -> ProgramSpec:
        """The same program (names, shapes, calls) holding other tensors: a second program for S4."""

        def shift(c: Constant) -> Constant:
            if c.tied is not None:
                return c  # its values are its source's, shifted with it
            values = None if c.values is None else tuple(v + 0.5 for v in c.values)
            return replace(c, seed=c.seed + offset, values=values)

        methods = tuple(
            replace(
                m,
                constants=tuple(shift(c) for c in m.constants),
                branch=None
                if m.branch is None
                else Branch(shift(m.branch.on_true), shift(m.branch.on_false)),
            )
            for m in self.methods
        )
        return replace(
            self, methods=methods, shared=tuple(shift(c) for c in self.shared), seed=self.seed + offset
        )

    def with_names(self, names: dict[str, str]) -> ProgramSpec:
        """The same program with constants renamed ``old -> new`` (private and shared alike), reads and
        writes following: what a program differing in names alone looks like."""

        def rename(c: Constant) -> Constant:
            tied = names.get(c.tied, c.tied) if c.tied is not None else None
            return replace(c, name=names.get(c.name, c.name), tied=tied)

        methods = tuple(
            replace(
                m,
                constants=tuple(rename(c) for c in m.constants),
                reads=tuple(names.get(r, r) for r in m.reads),
                writes=tuple(replace(w, target=names.get(w.target, w.target)) for w in m.writes),
            )
            for m in self.methods
        )
        return replace(self, methods=methods, shared=tuple(rename(c) for c in self.shared))

    def shared_constant(self, name: str) -> Constant | None:
        return next((c for c in self.shared if c.name == name), None)

    def written(self) -> set[tuple[str, str]]:
        """(owner, name) of every buffer some method writes; owner is ``SHARED`` or a method name."""
        out = set()
        for m in self.methods:
            for w in m.writes:
                out.add((m.name, w.target) if m.private(w.target) else (SHARED, w.target))
        return out


@dataclass(frozen=True)
class Scenario:
    """A named catalogue entry: the program, why it exists, and what a correct backend does with it.

    ``rejects`` is the rule a correct lowering raises for (P6/P7/P8), None for valid programs. ``tags`` let a
    conformance test pick the scenarios that exercise its rule.
    """

    name: str
    doc: str
    spec: ProgramSpec
    rejects: str | None = None
    tags: frozenset[str] = field(default_factory=frozenset)
    needs: frozenset[str] = field(default_factory=frozenset)
    """Program features a backend must express (``cond``, ``input_mutation``); see Backend.unsupported."""
    names: tuple[str, ...] = ()
    """What a rejection's message must mention (X1): the methods and keys at fault."""

    @property
    def valid(self) -> bool:
        return self.rejects is None


def _check_paths(owner: str, constants: tuple[Constant, ...]) -> None:
    """The paths of one owner's constants make one module tree: no path is another's submodule (``w`` and
    ``w.bias``), and a tied constant names another of the same owner, itself untied, of its shape or (tied
    transposed) its transpose's."""
    paths = {c.name: c for c in constants if c.family not in ("literal", "scalar")}
    for name, c in paths.items():
        parts = name.split(".")
        for i in range(1, len(parts)):
            if ".".join(parts[:i]) in paths:
                raise ValueError(f"{owner}: {'.'.join(parts[:i])!r} is a tensor and the module of {name!r}")
        if c.family in ("int8_linear", "linear") and any(p.startswith(f"{name}.") for p in paths):
            raise ValueError(f"{owner}: {name!r} is a linear layer and the module of another constant")
        if c.tied is None:
            continue
        source = paths.get(c.tied)
        if source is None or source.tied is not None or source.family not in TENSOR_FAMILIES:
            raise ValueError(f"{owner}: {name!r} is tied to {c.tied!r}, no untied tensor of the same owner")
        shape = source.shape[:-2] + source.shape[:-3:-1] if c.layout == "transposed" else source.shape
        if (c.dtype, c.shape) != (source.dtype, shape):
            raise ValueError(f"{owner}: {name!r} tied to {c.tied!r} is {c.dtype} {shape}, as that tensor is")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
