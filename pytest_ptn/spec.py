"""Multi-method programs described as plain data, so scenarios, fuzzers and reproducers share one type.

Nothing here imports torch: the catalogue is read at collection time, before any backend is touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

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

WRITE_OPS = ("add", "copy", "index_copy", "shift")
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

    ``drawn_as`` and ``nudged`` make the tensors content-sharing bugs confuse, compactly: the bytes of
    another dtype's draw (a float32 tensor's bit pattern held as int32), and a tensor equal to another
    but for a few elements (a fine-tuned method's weight beside the base one)."""

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
    """Flat indices of elements moved a little from what the draw gives: ``x + max(|x|, 1) / 256`` (at
    least the dtype's next value up), ``x + 1`` for an integer: an output changes beyond the comparison
    bound, a closeness test with a 1% tolerance calls the tensors equal."""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(
                f"constant {self.name!r}: unknown family {self.family!r}, expected one of {FAMILIES}"
            )
        if self.family == "scalar" and self.shape != ():
            raise ValueError(f"constant {self.name!r}: a scalar has shape (), not {self.shape}")
        if self.values is not None and len(self.values) != _numel(self.shape):
            raise ValueError(f"constant {self.name!r}: {len(self.values)} values for shape {self.shape}")
        if self.drawn_as is not None and ELEMENT_SIZES.get(self.drawn_as, 0) != ELEMENT_SIZES.get(self.dtype):
            raise ValueError(
                f"constant {self.name!r}: drawn as {self.drawn_as!r}, read as {self.dtype!r}: one bit "
                f"pattern needs two dtypes of one element size ({ELEMENT_SIZES})"
            )
        if any(not 0 <= i < _numel(self.shape) for i in self.nudged):
            raise ValueError(f"constant {self.name!r}: nudged {self.nudged} outside its {_numel(self.shape)}")


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
        for m in self.methods:
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
            return replace(c, name=names.get(c.name, c.name))

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


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
