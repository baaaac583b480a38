"""The named scenarios of SPEC section 5: programs that collide on purpose, and the ones rules reject.

Tags say what a scenario exercises, so each conformance test picks only the scenarios its rule is about:
``valid`` (all programs that must lower), ``collision`` (same name, different tensors), ``dedupe`` (equal
tensors stored once), ``shared_weight``, ``shared_state``, ``private_state``, ``buffers`` (buffers read,
so initial values matter), ``state_bytes`` (state equal in bytes to a constant), ``total_collision``,
``reject``, ``reduced_precision`` (computed in bf16 or fp16), ``quantizable`` (QUANTIZABLE), ``lookalike``
(constants of different content that a cache keyed on less than all of it takes for one: zeros of two
dtypes, tensors equal but for a few elements near the end, one byte pattern under two dtypes; no names in
common, so only content can explain a wrong value; LOOKALIKE).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import replace

from pytest_ptn.spec import Branch, Constant, Method, ProgramSpec, Scenario, Write

QUANTIZABLE = "quantizable"
"""The tag of a quantization-friendly scenario: a program of ``vectors`` (linear layers, no 0-d intermediate).
Backends that quantize each method (Capability.QUANTIZE) run these and no other scenario; float backends meet
the same collisions, shared weights and KV caches in the other scenarios, and skip these."""

ROW = (1, 8)
"""The input of a quantizable program's methods: one row, as wide as its linears' inputs."""


def _vals(*v: float) -> tuple[float, ...]:
    return tuple(float(x) for x in v)


def _attr(name: str, *v: float) -> Constant:
    return Constant(name, "attribute", values=_vals(*v))


def _arange(n: int, start: float = 0.0, step: float = 1.0) -> tuple[float, ...]:
    return tuple(start + step * i for i in range(n))


def _s(
    name: str,
    doc: str,
    spec: ProgramSpec,
    *tags: str,
    rejects: str | None = None,
    names: tuple[str, ...] = (),
    needs: tuple[str, ...] = (),
) -> Scenario:
    tagset = frozenset(tags) | ({"reject", rejects} if rejects else {"valid"})
    return Scenario(name, doc, spec, rejects, tagset, frozenset(needs), names)


SCENARIOS: tuple[Scenario, ...] = (
    _s(
        "colliding_scalars",
        "prefill scales by 0.125, decode adds 2.0: ExecuTorch lifts both to `_lifted_tensor_constant0`.",
        ProgramSpec(
            methods=(
                Method(
                    "prefill", (Constant("scale", "scalar", shape=(), values=(0.125,)),), reads=("scale",)
                ),
                Method("decode", (Constant("offset", "scalar", shape=(), values=(2.0,)),), reads=("offset",)),
            ),
            calls=("prefill", "decode", "prefill"),
        ),
        "collision",
    ),
    _s(
        "colliding_literals",
        "`torch.tensor(...)` built in each forward: both exported as `lifted_tensor_0` with other values.",
        ProgramSpec(
            methods=(
                Method("prefill", (Constant("t", "literal", values=_vals(1, 2, 3, 4)),), reads=("t",)),
                Method("decode", (Constant("t", "literal", values=_vals(10, 20, 30, 40)),), reads=("t",)),
            ),
            calls=("decode", "prefill", "decode"),
        ),
        "collision",
    ),
    _s(
        "colliding_tensor_constants",
        "A 16-element tensor attribute named `_tensor_constant0` in both methods (AOTInductor's naming; more "
        "than 8 elements, so it is not inlined), same dtype and shape, other bytes.",
        ProgramSpec(
            methods=(
                Method(
                    "encoder",
                    (Constant("_tensor_constant0", "attribute", shape=(16,), seed=1),),
                    reads=("_tensor_constant0",),
                ),
                Method(
                    "decoder",
                    (Constant("_tensor_constant0", "attribute", shape=(16,), seed=2),),
                    reads=("_tensor_constant0",),
                ),
            ),
        ),
        "collision",
    ),
    _s(
        "parameter_named_tensor_constant",
        "A parameter named `_tensor_constant0` in both methods (other bytes), prefill also reading a "
        "16-element attribute: AOTInductor names that attribute `_tensor_constant0` too, in the same graph.",
        ProgramSpec(
            methods=(
                Method(
                    "prefill",
                    (
                        Constant("_tensor_constant0", "parameter", shape=(16,), seed=43),
                        Constant("scale", "attribute", shape=(16,), seed=44),
                    ),
                    reads=("_tensor_constant0", "scale"),
                ),
                Method(
                    "decode",
                    (Constant("_tensor_constant0", "parameter", shape=(16,), seed=45),),
                    reads=("_tensor_constant0",),
                ),
            ),
        ),
        "collision",
    ),
    _s(
        "shared_weight",
        "One parameter `shared.w` read by both methods: stored once, loaded once.",
        ProgramSpec(
            methods=(
                Method("prefill", reads=("w",)),
                Method("decode", (Constant("t", "literal", values=_vals(5, 6, 7, 8)),), reads=("w", "t")),
            ),
            shared=(Constant("w", "parameter", shape=(8, 4), seed=3),),
        ),
        "shared_weight",
        "dedupe",
    ),
    _s(
        "large_shared_weight",
        "An 8 MiB parameter read by both methods beside small private ones: a second copy of it shows on any "
        "memory probe, a GPU's 2 MiB pages included (the case S6 is about).",
        ProgramSpec(
            methods=(
                Method(
                    "prefill", (Constant("p", "parameter", shape=(16,), seed=40),), reads=("embedding", "p")
                ),
                Method(
                    "decode", (Constant("p", "parameter", shape=(16,), seed=41),), reads=("embedding", "p")
                ),
            ),
            # Names no other scenario uses: a cache keyed by name across programs (aoti-upstream) must not
            # meet another scenario's `shared.w` here, or the outcome would depend on which ran first.
            shared=(Constant("embedding", "parameter", shape=(2048, 1024), seed=42),),
        ),
        "shared_weight",
        "dedupe",
        "collision",
    ),
    _s(
        "equal_values_different_names",
        "`scale_a` in one method and `scale_b` in the other hold equal bytes: stored once, shared storage.",
        ProgramSpec(
            methods=(
                Method("a", (Constant("scale_a", "buffer", shape=(16,), seed=4),), reads=("scale_a",)),
                Method("b", (Constant("scale_b", "buffer", shape=(16,), seed=4),), reads=("scale_b",)),
            ),
        ),
        "dedupe",
    ),
    _s(
        "same_metadata_different_bytes",
        "A parameter `weight` in each method: same FQN, dtype, shape, strides and device; only bytes differ.",
        ProgramSpec(
            methods=(
                Method(
                    "prefill", (Constant("weight", "parameter", shape=(4, 4), seed=5),), reads=("weight",)
                ),
                Method("decode", (Constant("weight", "parameter", shape=(4, 4), seed=6),), reads=("weight",)),
            ),
        ),
        "collision",
    ),
    _s(
        "same_metadata_different_bytes_fp16",
        "The same collision in float16 weights. ExecuTorch's external-constants mode can lower these (the "
        "dtype cast copies the weight) and then keeps one `.ptd` entry per FQN for both methods.",
        ProgramSpec(
            methods=(
                Method(
                    "prefill",
                    (Constant("weight", "parameter", dtype="float16", shape=(4, 4), seed=5),),
                    reads=("weight",),
                ),
                Method(
                    "decode",
                    (Constant("weight", "parameter", dtype="float16", shape=(4, 4), seed=6),),
                    reads=("weight",),
                ),
            ),
        ),
        "collision",
    ),
    _s(
        "torchao_int8_weights",
        "A torchao int8 weight-only `proj` in each method: `proj.parametrizations.weight.original0..2` "
        "(int8 data, scales, zero points) collide across methods with other values.",
        ProgramSpec(
            methods=(
                Method("prefill", (Constant("proj", "int8_linear", shape=(4, 4), seed=20),), reads=("proj",)),
                Method("decode", (Constant("proj", "int8_linear", shape=(4, 4), seed=21),), reads=("proj",)),
            ),
        ),
        "collision",
        needs=("torchao",),
    ),
    _s(
        "total_collision",
        "Every constant name of `decode` is already used by `prefill`: `weight` and `_tensor_constant0` "
        "differ, "
        "`bias` is equal. A loader that skips its check when all names are cached reads prefill's data.",
        ProgramSpec(
            methods=(
                Method(
                    "prefill",
                    (
                        Constant("weight", "parameter", shape=(4, 4), seed=7),
                        Constant("bias", "parameter", shape=(4,), seed=8),
                        Constant("_tensor_constant0", "attribute", shape=(16,), seed=9),
                    ),
                    reads=("weight", "bias", "_tensor_constant0"),
                ),
                Method(
                    "decode",
                    (
                        Constant("weight", "parameter", shape=(4, 4), seed=10),
                        Constant("bias", "parameter", shape=(4,), seed=8),
                        Constant("_tensor_constant0", "attribute", shape=(16,), seed=11),
                    ),
                    reads=("weight", "bias", "_tensor_constant0"),
                ),
            ),
        ),
        "collision",
        "total_collision",
        "dedupe",
    ),
    _s(
        "kv_cache",
        "A shared KV cache `shared.kv` written row by row by `prefill` (index_copy_) and read by `decode`; "
        "the calls interleave the two methods.",
        ProgramSpec(
            methods=(
                Method("prefill", writes=(Write("kv", "index_copy"),), reads=("kv",)),
                Method("decode", (Constant("t", "literal", values=_vals(1, 1, 2, 2)),), reads=("kv", "t")),
            ),
            shared=(Constant("kv", "buffer", shape=(4, 4), values=(0.0,) * 16),),
            calls=("decode", "prefill", "decode", "prefill", "prefill", "decode"),
        ),
        "shared_state",
        "buffers",
    ),
    _s(
        "nonpersistent_written",
        "A non-persistent buffer `shared.acc` that `step` adds to and `peek` reads.",
        ProgramSpec(
            methods=(
                Method("step", writes=(Write("acc", "add"),), reads=("acc",)),
                Method("peek", reads=("acc",)),
            ),
            shared=(Constant("acc", "buffer", shape=(4,), values=_vals(1, 2, 3, 4), persistent=False),),
            calls=("peek", "step", "peek", "step", "peek"),
        ),
        "shared_state",
        "buffers",
    ),
    _s(
        "write_only_buffer",
        "`save` copies into `shared.last` without ever reading it; `load` reads it. A lowering that drops "
        "buffers a method never reads loses the write.",
        ProgramSpec(
            methods=(
                Method(
                    "save",
                    (Constant("t", "literal", values=_vals(1, 2, 3, 4)),),
                    reads=("t",),
                    writes=(Write("last", "copy"),),
                ),
                Method("load", reads=("last",)),
            ),
            shared=(Constant("last", "buffer", shape=(4,), values=_vals(5, 5, 5, 5)),),
            calls=("load", "save", "load"),
        ),
        "shared_state",
        "buffers",
    ),
    _s(
        "nonpersistent_readonly",
        "A read-only non-persistent buffer holding `arange(8)`: it must not start zero-filled.",
        ProgramSpec(
            methods=(
                Method("prefill", reads=("positions",)),
                Method(
                    "decode", (Constant("t", "literal", values=_vals(3, 1, 4, 1)),), reads=("positions", "t")
                ),
            ),
            shared=(Constant("positions", "buffer", shape=(8,), values=_arange(8), persistent=False),),
        ),
        "buffers",
    ),
    _s(
        "private_same_shape_buffers",
        "`a_state` and `b_state`, same shape, each written by one method only: calls of the other must not "
        "touch it.",
        ProgramSpec(
            methods=(
                Method(
                    "a",
                    (Constant("a_state", "buffer", shape=(4,), values=(0.0,) * 4),),
                    writes=(Write("a_state", "add"),),
                    reads=("a_state",),
                ),
                Method(
                    "b",
                    (Constant("b_state", "buffer", shape=(4,), values=(0.0,) * 4),),
                    writes=(Write("b_state", "add"),),
                    reads=("b_state",),
                ),
            ),
            calls=("a", "b", "a", "b", "b", "a"),
        ),
        "private_state",
        "buffers",
    ),
    _s(
        "equal_bytes_state",
        "A mutable `shared.counter` starts with the same bytes as the immutable `zeros`: it must be stored "
        "apart, never aliased.",
        ProgramSpec(
            methods=(
                Method("count", writes=(Write("counter", "add"),), reads=("counter",)),
                Method(
                    "read",
                    (Constant("zeros", "buffer", shape=(4,), values=(0.0,) * 4),),
                    reads=("zeros", "counter"),
                ),
            ),
            shared=(Constant("counter", "buffer", shape=(4,), values=(0.0,) * 4),),
            calls=("count", "read", "count", "read"),
        ),
        "shared_state",
        "state_bytes",
        "buffers",
    ),
    _s(
        "conflicting_state",
        "Both methods mutate a buffer `cache` but start it from different values: rejected (P7).",
        ProgramSpec(
            methods=(
                Method(
                    "prefill",
                    (Constant("cache", "buffer", shape=(4,), values=(0.0,) * 4),),
                    writes=(Write("cache", "add"),),
                    reads=("cache",),
                ),
                Method(
                    "decode",
                    (Constant("cache", "buffer", shape=(4,), values=(1.0,) * 4),),
                    writes=(Write("cache", "add"),),
                    reads=("cache",),
                ),
            ),
        ),
        rejects="P7",
        names=("cache", "prefill", "decode"),
    ),
    _s(
        "method_named_state",
        "A method called `state` would share the namespace of mutable keys: rejected (P6).",
        ProgramSpec(
            methods=(
                Method("state", (Constant("w", "parameter", shape=(4,), seed=12),), reads=("w",)),
                Method("decode", (Constant("w", "parameter", shape=(4,), seed=13),), reads=("w",)),
            ),
        ),
        rejects="P6",
        names=("state",),
    ),
    _s(
        "final_name_collision",
        "Method `enc` key `attn/scale` and method `enc/attn` key `scale` both become `enc/attn/scale`: "
        "rejected (P8).",
        ProgramSpec(
            methods=(
                Method(
                    "enc", (Constant("attn/scale", "buffer", shape=(4,), seed=14),), reads=("attn/scale",)
                ),
                Method("enc/attn", (Constant("scale", "buffer", shape=(4,), seed=15),), reads=("scale",)),
            ),
        ),
        rejects="P8",
        names=("'enc'", "attn/scale", "enc/attn", "'scale'"),
    ),
    _s(
        "single_method",
        "One method with a parameter and a literal: namespaced all the same (P1).",
        ProgramSpec(
            methods=(
                Method(
                    "forward",
                    (
                        Constant("w", "parameter", shape=(4, 4), seed=16),
                        Constant("t", "literal", values=_vals(9, 8, 7, 6)),
                    ),
                    reads=("w", "t"),
                ),
            ),
        ),
    ),
    _s(
        "input_mutation",
        "`step` adds 1 to its input in place before reading a constant: the caller sees the mutation.",
        ProgramSpec(
            methods=(
                Method(
                    "step",
                    (Constant("t", "literal", values=_vals(1, 2, 3, 4)),),
                    reads=("t",),
                    mutates_input=True,
                ),
                Method("other", (Constant("t", "literal", values=_vals(4, 3, 2, 1)),), reads=("t",)),
            ),
        ),
        "collision",
        needs=("input_mutation",),
    ),
    _s(
        "cond_constants",
        "`torch.cond` whose branches each add their own constant tensor, named alike in both methods.",
        ProgramSpec(
            methods=(
                Method(
                    "prefill",
                    branch=Branch(
                        _attr("_tensor_constant0", 1, 2, 3, 4), _attr("_tensor_constant1", 4, 3, 2, 1)
                    ),
                ),
                Method(
                    "decode",
                    branch=Branch(
                        _attr("_tensor_constant0", 10, 20, 30, 40), _attr("_tensor_constant1", 9, 8, 7, 6)
                    ),
                ),
            ),
            calls=("prefill", "decode", "prefill", "decode"),
        ),
        "collision",
        needs=("cond",),
    ),
    _s(
        "eight_methods",
        "Eight methods each with a literal, a `_tensor_constant0` attribute and a scalar, all colliding.",
        ProgramSpec(
            methods=tuple(
                Method(
                    f"m{i}",
                    (
                        Constant("t", "literal", values=_arange(4, start=float(i))),
                        Constant("_tensor_constant0", "attribute", shape=(16,), seed=100 + i),
                        Constant("s", "scalar", shape=(), values=(float(i) / 8,)),
                    ),
                    reads=("t", "_tensor_constant0", "s"),
                )
                for i in range(8)
            ),
        ),
        "collision",
    ),
)


def _computed_in(dtype: str, suffix: str, calls: tuple[str, ...] = ()) -> Callable[[Scenario], Scenario]:
    """The same scenario computed in ``dtype``: its inputs, constants and arithmetic (``calls`` replacing the
    call sequence where given), tagged ``reduced_precision``. Named constants get the suffix too: within the
    program they collide as before, but never with the float32 scenario's, which a cache keyed by name
    across programs (aoti-upstream) would otherwise meet, its outcome depending on which case ran first."""

    def named(name: str) -> str:
        return f"{name}_{suffix}"

    def convert(c: Constant) -> Constant:
        if c.family == "int8_linear":
            return c
        renamed = c.name if c.family in ("literal", "scalar") else named(c.name)
        return replace(c, name=renamed, dtype=dtype)

    def variant(s: Scenario) -> Scenario:
        known = {c.name: convert(c).name for m in s.spec.methods for c in m.constants}
        known |= {c.name: convert(c).name for c in s.spec.shared}
        methods = tuple(
            replace(
                m,
                constants=tuple(map(convert, m.constants)),
                reads=tuple(known[r] for r in m.reads),
                writes=tuple(replace(w, target=known[w.target]) for w in m.writes),
            )
            for m in s.spec.methods
        )
        spec = replace(
            s.spec,
            dtype=dtype,
            methods=methods,
            shared=tuple(map(convert, s.spec.shared)),
            calls=calls or s.spec.calls,
        )
        doc = f"{s.doc} Computed in {dtype}, its named constants suffixed `_{suffix}`: compared as {dtype} "
        doc += "results are (pytest_ptn.instruments.comparison)."
        if calls:
            doc += f" Calls: {', '.join(calls)}."
        tags = s.tags | {"reduced_precision"}
        return replace(s, name=f"{s.name}_in_{suffix}", doc=doc, spec=spec, tags=tags)

    return variant


REDUCED_PRECISION_OF = (
    "colliding_literals",
    "same_metadata_different_bytes",
    "shared_weight",
    "kv_cache",
    "nonpersistent_written",
)
"""The scenarios that also run computed in bf16 and in fp16, as real LLMs run: the collisions, a shared
weight, a KV cache and a buffer that starts from non-zero values (whose zero-filling must still show)."""
_BASE = {s.name: s for s in SCENARIOS}
PREFILL_FIRST = ("prefill", "decode", "prefill", "decode")
"""A runner's order: the KV cache variants start with prefill, so decode first loads after prefill wrote."""

SCENARIOS += tuple(
    _computed_in(dtype, suffix, PREFILL_FIRST if name == "kv_cache" else ())(_BASE[name])
    for dtype, suffix in (("bfloat16", "bf16"), ("float16", "fp16"))
    for name in REDUCED_PRECISION_OF
)
SCENARIOS += (
    _s(
        "aliased_submodule",
        "The shared root is also reachable as `rope`, as llama's rope module hangs off the model and every "
        "layer: its weight `w` and read-only non-persistent `freqs` each have two FQNs (`shared.w`, "
        "`rope.w`), one tensor: one constant, one allocation, stored once.",
        ProgramSpec(
            methods=(
                Method("prefill", reads=("w", "freqs")),
                Method(
                    "decode", (Constant("t", "literal", values=_vals(2, 4, 6, 8)),), reads=("w", "freqs", "t")
                ),
            ),
            shared=(
                Constant("w", "parameter", shape=(4, 4), seed=50),
                Constant("freqs", "buffer", shape=(8,), values=_arange(8, start=1.0), persistent=False),
            ),
            shared_alias="rope",
        ),
        "shared_weight",
        "dedupe",
        "buffers",
    ),
)

SCENARIOS += (
    _s(
        "quantized_linears",
        "Each method its own `proj` linear (same FQN, other bytes) and the shared linear `shared.embed`, "
        "read in another order: quantized per method, `_frozen_param0`/`_frozen_param1` and `_scale_<i>` "
        "collide with other bytes, the shared weight becomes a per-method `_frozen_param<i>` of equal bytes.",
        ProgramSpec(
            methods=(
                Method(
                    "prefill",
                    (Constant("proj", "linear", shape=(8, 8), seed=60),),
                    reads=("proj", "embed"),
                    input_shape=ROW,
                ),
                Method(
                    "decode",
                    (Constant("proj", "linear", shape=(8, 8), seed=62),),
                    reads=("embed", "proj"),
                    input_shape=ROW,
                ),
            ),
            shared=(Constant("embed", "linear", shape=(8, 8), seed=64),),
            calls=("prefill", "decode", "prefill"),
            vectors=True,
        ),
        "collision",
        "shared_weight",
        "dedupe",
        QUANTIZABLE,
    ),
    _s(
        "quantized_cache",
        "A shared KV cache `shared.kv` that `prefill` shifts a row into and both methods read, beside a "
        "private `proj` linear in each (quantized per method: colliding `_frozen_param0`); prefill first, "
        "as a runner calls them.",
        ProgramSpec(
            methods=(
                Method(
                    "prefill",
                    (Constant("proj", "linear", shape=(8, 8), seed=66),),
                    reads=("proj", "kv"),
                    writes=(Write("kv", "shift"),),
                    input_shape=ROW,
                ),
                Method(
                    "decode",
                    (Constant("proj", "linear", shape=(8, 8), seed=68),),
                    reads=("kv", "proj"),
                    input_shape=ROW,
                ),
            ),
            shared=(Constant("kv", "buffer", shape=(4, 8), values=(0.0,) * 32),),
            calls=PREFILL_FIRST + ("prefill", "decode"),
            vectors=True,
        ),
        "collision",
        "shared_state",
        "buffers",
        QUANTIZABLE,
    ),
)

LOOKALIKE = "lookalike"
"""The tag of a scenario whose constants differ in content but agree on what a partial key sees: dtype-blind
bytes, a digest of the first KiB, closeness (executorch #23891 dedupes immutable constants by content, #21823
keys weights by a digest of their bytes). S2 runs on these as on collisions. Each holds its own dtypes, so
none gets a ``_computed_in`` variant: converting its constants to one dtype would erase the hazard."""

_LONG = 640
"""Elements of a near-equal weight: 2560 B in float32, 1280 B in bfloat16, so the first KiB of both holds
equal bytes only."""

_NUDGED = (587, 601, 631)
"""Where a near-equal weight differs: past the first KiB, near the end but not at it, at primes (no stride
of a sample starting at 0 lands there)."""


def _long(step: int) -> list[float]:
    """A long weight of multiples of 1/16 (exact in bfloat16 too), 1.875 at _NUDGED."""
    values = [((i * step + 11) % 61 - 30) / 16 for i in range(_LONG)]
    for i in _NUDGED:
        values[i] = 1.875
    return values


def _nudged(values: list[float], by: float) -> tuple[float, ...]:
    """``values`` with ``by`` added at _NUDGED: 1.875 becomes 1.8823 in float32 (2**-8 of it) or 1.8828 in
    bfloat16 (one step), close for rtol=atol=1e-2, while weighted_sum weighs each by its position (past 587):
    outputs of 2800 to 4400 move by about 13, past a float32 bound of 0.05 at most."""
    return tuple(v + by if i in _NUDGED else v for i, v in enumerate(values))


def _bits(fmt: str, to: str, values: tuple[float, ...]) -> tuple[float, ...]:
    """``values`` packed as ``fmt``, read back as ``to`` (struct codes): one byte pattern, another dtype."""
    return tuple(float(struct.unpack(f"<{to}", struct.pack(f"<{fmt}", v))[0]) for v in values)


_EIGHTHS = _vals(3, -5, 7, 12, -1, 9, -14, 2, 11, -6, 4, -13, 10, 1, -8, 15)
_FLOAT32_GAIN = tuple(v / 8 for v in _EIGHTHS)
"""Exact in float32 and bfloat16; as int32 bits, integers of about 1e9 (float32 read as int32 never gives a
NaN, the other way could)."""
_BF16_SCALE = tuple(v / 8 for v in _EIGHTHS[::-1])
_BF16_AS_FP16 = tuple(_bits("H", "e", tuple(int(b) >> 16 for b in _bits("f", "I", _BF16_SCALE))))
"""float16 values holding _BF16_SCALE's bit patterns: finite, between 1 and 2 in magnitude."""


def _zeros(name: str, family: str, dtype: str) -> Constant:
    return Constant(name, family, dtype=dtype, shape=(4, 4), values=(0.0,) * 16)


SCENARIOS += (
    _s(
        "zero_caches_two_dtypes",
        "A zero float32 KV cache `k_cache` of `prefill` and a zero int32 `pos_cache` of `decode` (64 B "
        "each), each written and read by its method only, beside zero immutable constants `attn_bias` "
        "(bfloat16) and `pad_mask` (float16) (32 B each); no name in common. Merging either pair is keying "
        "bytes without their dtype (the caches: one memory for both). The caches are not bfloat16: a bf16 "
        "state is a delegate input, which OpenVINO cannot lower (no bf16 in its dtype table), and the "
        "program would not lower there.",
        ProgramSpec(
            methods=(
                Method(
                    "prefill",
                    (_zeros("k_cache", "buffer", "float32"), _zeros("attn_bias", "parameter", "bfloat16")),
                    reads=("k_cache", "attn_bias"),
                    writes=(Write("k_cache", "index_copy"),),
                ),
                Method(
                    "decode",
                    (_zeros("pos_cache", "buffer", "int32"), _zeros("pad_mask", "buffer", "float16")),
                    reads=("pos_cache", "pad_mask"),
                    writes=(Write("pos_cache", "index_copy"),),
                ),
            ),
            calls=PREFILL_FIRST + ("decode", "prefill"),
        ),
        LOOKALIKE,
        "private_state",
    ),
    _s(
        "near_equal_weights",
        f"A {_LONG}-element float32 `base_proj` of `prefill` and `tuned_proj` of `decode` (a base and a "
        "fine-tuned weight), and a bfloat16 pair `base_embed`/`tuned_embed`, equal but at elements "
        f"{_NUDGED} (about 0.4% apart, one bfloat16 step): a digest of the first KiB, a strided sample or "
        "closeness (rtol=atol=1e-2) takes them for one, the outputs differ by about 13.",
        ProgramSpec(
            methods=(
                Method(
                    "prefill",
                    (
                        Constant("base_proj", "parameter", shape=(_LONG,), values=tuple(_long(37))),
                        Constant("base_embed", "parameter", "bfloat16", (_LONG,), values=tuple(_long(53))),
                    ),
                    reads=("base_proj", "base_embed"),
                ),
                Method(
                    "decode",
                    (
                        Constant(
                            "tuned_proj",
                            "parameter",
                            shape=(_LONG,),
                            values=_nudged(_long(37), 1.875 * 2**-8),
                        ),
                        Constant(
                            "tuned_embed",
                            "parameter",
                            "bfloat16",
                            (_LONG,),
                            values=_nudged(_long(53), 2**-7),
                        ),
                    ),
                    reads=("tuned_proj", "tuned_embed"),
                ),
            ),
            calls=("prefill", "decode", "prefill"),
        ),
        LOOKALIKE,
    ),
    _s(
        "equal_bytes_two_dtypes",
        "`norm_gain` (float32) of `encode` and `norm_gain_bits` (int32, its bit patterns) of `decode`, and "
        "`out_scale` (bfloat16) of `encode` and `out_scale_bits` (float16, the same 16-bit patterns) of "
        "`decode`: equal bytes, shape and strides, other dtypes and values. A dedupe keyed on bytes without "
        "dtype hands one method the other's.",
        ProgramSpec(
            methods=(
                Method(
                    "encode",
                    (
                        Constant("norm_gain", "parameter", shape=(16,), values=_FLOAT32_GAIN),
                        Constant("out_scale", "parameter", "bfloat16", (16,), values=_BF16_SCALE),
                    ),
                    reads=("norm_gain", "out_scale"),
                ),
                Method(
                    "decode",
                    (
                        Constant(
                            "norm_gain_bits", "buffer", "int32", (16,), values=_bits("f", "i", _FLOAT32_GAIN)
                        ),
                        Constant("out_scale_bits", "buffer", "float16", (16,), values=_BF16_AS_FP16),
                    ),
                    reads=("norm_gain_bits", "out_scale_bits"),
                ),
            ),
            calls=("encode", "decode", "encode"),
        ),
        LOOKALIKE,
    ),
)


REAL_SHAPES = "real_shapes"
"""The tag of a scenario built to hold what real programs hold and the suite's first scenarios did not
(pytest_ptn.programs.survey: nested paths whose leaves repeat across layers and methods, state per layer,
tied and non-contiguous weights, content that differs at 1e-3 and below, one byte pattern under two shapes, a
constant equal to a state's initial value): what a loader keyed on less than a tensor's whole path, layout or
content gets wrong."""


def _layer(i: int, leaf: str) -> str:
    return f"layers.{i}.attention.{leaf}"


_FINE = 5e-4
"""How far every element of `close_weights`' tuned weight moves (relative to ``max(|x|, 1)``): within a
closeness test of 1e-3, and, over 64 elements, about 3e-3 of each output, far past float32's 1e-5 bound."""
_FINER = 5e-5
"""The same within 1e-4: about 3e-4 of each output."""
_FINEST = 8e-6
"""The same within 1e-5, over 1024 elements: about 2e-4 of each output, still past float32's bound."""

SCENARIOS += (
    _s(
        "nested_layers",
        "Two transformer layers in each method: `layers.0.attention.wq`, `layers.1.attention.wq` and "
        "`layers.0.attention_norm.weight`, the same paths in `prefill` and `decode` with other bytes, beside "
        "one bool causal mask `layers.0.attention.mask` (non-persistent, the same in both). One "
        "leaf (`wq`) in two layers of one method: a loader that binds by the last part of a path reads layer "
        "0's weight for layer 1.",
        ProgramSpec(
            methods=tuple(
                Method(
                    name,
                    (
                        Constant(_layer(0, "wq"), "parameter", shape=(4, 4), seed=seed),
                        Constant(_layer(1, "wq"), "parameter", shape=(4, 4), seed=seed + 1),
                        Constant("layers.0.attention_norm.weight", "parameter", shape=(4,), seed=seed + 2),
                        Constant(_layer(0, "mask"), "buffer", "bool", (4, 4), seed=76, persistent=False),
                    ),
                    reads=(
                        _layer(0, "wq"),
                        _layer(1, "wq"),
                        "layers.0.attention_norm.weight",
                        _layer(0, "mask"),
                    ),
                )
                for name, seed in (("prefill", 70), ("decode", 73))
            ),
            calls=("prefill", "decode", "prefill"),
        ),
        "collision",
        REAL_SHAPES,
    ),
    _s(
        "per_layer_caches",
        "A KV cache per layer, `shared.layers.0.attention.k_cache` and `shared.layers.1.attention.k_cache` "
        "(zeros, one shape): `prefill` writes a row into layer 0's and adds to layer 1's, `decode` reads "
        "both. A loader that keys state by its leaf (`k_cache`), or dedupes state by content, gives the two "
        "layers one memory.",
        ProgramSpec(
            methods=(
                Method(
                    "prefill",
                    writes=(Write(_layer(0, "k_cache"), "index_copy"), Write(_layer(1, "k_cache"), "add")),
                    reads=(_layer(0, "k_cache"),),
                ),
                Method("decode", reads=(_layer(0, "k_cache"), _layer(1, "k_cache"))),
            ),
            shared=(
                Constant(_layer(0, "k_cache"), "buffer", shape=(4, 4), values=(0.0,) * 16),
                Constant(_layer(1, "k_cache"), "buffer", shape=(4, 4), values=(0.0,) * 16),
            ),
            calls=PREFILL_FIRST + ("prefill", "decode"),
        ),
        "shared_state",
        "buffers",
        REAL_SHAPES,
    ),
    _s(
        "tied_output_layer",
        "`decode`'s output layer `output.weight` is its embedding `tok_embeddings.weight` transposed: one "
        "storage, a non-contiguous view (strides (1, 4)); `prefill` holds its own `tok_embeddings.weight` "
        "(other bytes). A packer or a digest that reads a tensor's memory in order, its strides lost, reads "
        "the embedding for the output layer.",
        ProgramSpec(
            methods=(
                Method(
                    "prefill",
                    (Constant("tok_embeddings.weight", "parameter", shape=(8, 4), seed=80),),
                    reads=("tok_embeddings.weight",),
                ),
                Method(
                    "decode",
                    (
                        Constant("tok_embeddings.weight", "parameter", shape=(8, 4), seed=81),
                        Constant(
                            "output.weight",
                            "parameter",
                            shape=(4, 8),
                            layout="transposed",
                            tied="tok_embeddings.weight",
                        ),
                    ),
                    reads=("output.weight", "tok_embeddings.weight"),
                ),
            ),
            calls=("decode", "prefill", "decode"),
        ),
        "collision",
        REAL_SHAPES,
    ),
    _s(
        "tied_across_methods",
        "One embedding table under two paths of the shared root, `tok_embeddings.weight` and `output.weight` "
        "(tied: one tensor, as Voxtral's output layer is its token embedding): `token_embedding` reads the "
        "first, `text_decoder` the second. One tensor: stored once, one allocation.",
        ProgramSpec(
            methods=(
                Method("token_embedding", reads=("tok_embeddings.weight",)),
                Method(
                    "text_decoder",
                    (Constant("t", "literal", values=_vals(1, 2, 3, 4)),),
                    reads=("output.weight", "t"),
                ),
            ),
            shared=(
                Constant("tok_embeddings.weight", "parameter", shape=(8, 4), seed=82),
                Constant("output.weight", "parameter", shape=(8, 4), tied="tok_embeddings.weight"),
            ),
        ),
        "shared_weight",
        "dedupe",
        REAL_SHAPES,
    ),
    _s(
        "strided_weights",
        "Weights that are views, as real ones are: `attention.wq` a slice past `attention.wk`'s values in a "
        "fused storage (an offset), `attention.wv` every other element of a wider storage (stride 2) and "
        "`proj.weight` stored transposed (strides (1, 4)), in both methods under one name with other bytes. "
        "A packer that writes a tensor's storage, not its values, stores other values than the program "
        "reads.",
        ProgramSpec(
            methods=tuple(
                Method(
                    name,
                    (
                        Constant("attention.wq", "parameter", shape=(4, 4), seed=seed, layout="offset"),
                        Constant("attention.wv", "buffer", shape=(2, 4), seed=seed + 1, layout="strided"),
                        Constant(
                            "proj.weight", "parameter", shape=(4, 4), seed=seed + 2, layout="transposed"
                        ),
                    ),
                    reads=("attention.wq", "attention.wv", "proj.weight"),
                )
                for name, seed in (("prefill", 84), ("decode", 87))
            ),
            calls=("prefill", "decode", "prefill"),
        ),
        "collision",
        "buffers",
        REAL_SHAPES,
    ),
    _s(
        "close_weights",
        "A base weight of `prefill` and the fine-tuned one of `decode` differing in every element by "
        f"{_FINE} of it (`base.weight`, `tuned.weight`, 64 elements), a pair differing by {_FINER} "
        f"(`base.bias`, `tuned.bias`) and one of 1024 elements differing by {_FINEST} (`base.embed`, "
        "`tuned.embed`): a dedupe by closeness at 1e-3 (1e-4, 1e-5) takes each pair for one; each output "
        "moves by about 3e-3 (3e-4, 2e-4), past float32's comparison bound.",
        ProgramSpec(
            methods=(
                Method(
                    "prefill",
                    (
                        Constant("base.weight", "parameter", shape=(8, 8), seed=90),
                        Constant("base.bias", "parameter", shape=(8, 8), seed=91),
                        Constant("base.embed", "parameter", shape=(32, 32), seed=92),
                    ),
                    reads=("base.weight", "base.bias", "base.embed"),
                ),
                Method(
                    "decode",
                    (
                        Constant(
                            "tuned.weight", "parameter", shape=(8, 8), seed=90, nudged_from=0, nudge=_FINE
                        ),
                        Constant(
                            "tuned.bias", "parameter", shape=(8, 8), seed=91, nudged_from=0, nudge=_FINER
                        ),
                        Constant(
                            "tuned.embed", "parameter", shape=(32, 32), seed=92, nudged_from=0, nudge=_FINEST
                        ),
                    ),
                    reads=("tuned.weight", "tuned.bias", "tuned.embed"),
                ),
            ),
            calls=("prefill", "decode", "prefill"),
        ),
        LOOKALIKE,
        REAL_SHAPES,
    ),
    _s(
        "equal_bytes_two_shapes",
        "`attention.wq` (4, 4) of `prefill` and `mlp.gate` (16,) of `decode` hold the same float32 bytes, "
        "and so do `conv.weight` (2, 2, 4) and `mlp.up` (2, 8): other shapes, one byte pattern. A dedupe "
        "keyed on dtype and bytes without the shape shares them.",
        ProgramSpec(
            methods=(
                Method(
                    "prefill",
                    (
                        Constant("attention.wq", "parameter", shape=(4, 4), seed=92),
                        Constant("conv.weight", "parameter", shape=(2, 2, 4), seed=93),
                    ),
                    reads=("attention.wq", "conv.weight"),
                ),
                Method(
                    "decode",
                    (
                        Constant("mlp.gate", "parameter", shape=(16,), seed=92),
                        Constant("mlp.up", "parameter", shape=(2, 8), seed=93),
                    ),
                    reads=("mlp.gate", "mlp.up"),
                ),
            ),
            calls=("prefill", "decode", "prefill"),
        ),
        LOOKALIKE,
        REAL_SHAPES,
    ),
    _s(
        "reordered_weights",
        "`attention.wq` of `prefill` and `attention.wk` of `decode` hold the same 16 values in another order "
        "(one is the other's transpose, each stored row-major): a digest of the sorted values, a sum or a "
        "histogram takes them for one.",
        ProgramSpec(
            methods=(
                Method(
                    "prefill",
                    (Constant("attention.wq", "parameter", shape=(4, 4), seed=94),),
                    reads=("attention.wq",),
                ),
                Method(
                    "decode",
                    (Constant("attention.wk", "parameter", shape=(4, 4), seed=94, reordered=True),),
                    reads=("attention.wk",),
                ),
            ),
            calls=("prefill", "decode", "prefill"),
        ),
        LOOKALIKE,
        REAL_SHAPES,
    ),
    _s(
        "constant_equal_to_state",
        "`read`'s weight `norm.weight` starts equal in bytes to the shared state `running.mean` (not zeros), "
        "which `step` adds to: a loader that dedupes a constant with state of its bytes binds the weight to "
        "the state's memory, and the weight then follows the state's writes.",
        ProgramSpec(
            methods=(
                Method("step", writes=(Write("running.mean", "add"),), reads=("running.mean",)),
                Method(
                    "read",
                    (Constant("norm.weight", "parameter", shape=(4,), seed=95),),
                    reads=("norm.weight", "running.mean"),
                ),
            ),
            shared=(Constant("running.mean", "buffer", shape=(4,), seed=95),),
            calls=("read", "step", "read", "step", "read"),
        ),
        "shared_state",
        "state_bytes",
        "buffers",
        REAL_SHAPES,
    ),
)

BY_NAME = {s.name: s for s in SCENARIOS}


def tagged(*tags: str) -> list[Scenario]:
    """Scenarios carrying every one of ``tags``."""
    return [s for s in SCENARIOS if set(tags) <= s.tags]
