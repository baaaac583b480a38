"""Realistic defects of a loader or packager, each a small broken variant of the reference backend, with the
ground truth of what must catch it: the suite's detection power is the share of these it kills (issue 57).

Each ``Defect`` is named after the upstream issue, PR or pattern it comes from, says which mechanism kinds
its failure must carry (``pytest_ptn.mechanisms.Kind``) and which selection catches it in CI (a ``-k`` of the
scenario suite, or the ptn-ci fuzz). Select one as ``--ptn-backend=defect_corpus:ClassName`` with ``tests/``
on the path. tests/test_defect_corpus.py runs each member's CI selection; benchmarks/detection.py runs every
mode on every member and prints the kill rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from broken_backends import (
    BindsByKey,
    ClosenessDedupe,
    DtypeBlindDedupe,
    MetadataOnly,
    PrefixDigestCache,
    ProcessWideByName,
    ReinitOnLateLoad,
    StateCopiedPerMethod,
    TrustsCachedNames,
    Uses,
    _ClosenessCache,
    _Loader,
    _WithLoader,
)

from pytest_ptn.backends.reference import ReferenceBackend
from pytest_ptn.instruments import content
from pytest_ptn.mechanisms import Kind
from pytest_ptn.reference import planner
from pytest_ptn.reference.loader import ReferenceLoaded
from pytest_ptn.reference.planner import PackagePlan
from pytest_ptn.spec import Constant, Method, ProgramSpec


class _GeneratedNamesOnlyLoaded(ReferenceLoaded):
    """Keys ``_tensor_constant*`` by method and every other constant by its bare name, first load wins."""

    def bind(self, method: str, key: str, final: str) -> torch.Tensor:
        by_name = self.__dict__.setdefault("_by_name", {})
        name = (method, key) if key.startswith("_tensor_constant") else key
        if name not in by_name:
            by_name[name] = super().bind(method, key, final)
        return by_name[name]


class GeneratedNamesOnly(_WithLoader):
    """A constant cache by name that namespaces only AOTInductor's ``_tensor_constant*`` per method, as
    PR #21823 left it: ``_lifted_tensor_constant*``, ``lifted_tensor_*`` and user names stay bound by name."""

    name = "corpus-generated-names-only"

    loaded = _GeneratedNamesOnlyLoaded


class _IntegerZeroFilledLoaded(ReferenceLoaded):
    def bind(self, method: str, key: str, final: str) -> torch.Tensor:
        host = self.package_tensor(final)
        if host.is_floating_point() or host.is_complex():
            return super().bind(method, key, final)
        return self.allocate(torch.zeros_like(host))


class IntegerConstantsZeroFilled(_WithLoader):
    """Integer constants are allocated but never filled: the copy of constant data handles floating dtypes
    only, so an int64 index or an int32 table starts at zero (as to_native ships no data for non-persistent
    buffers, which then start at zero)."""

    name = "corpus-int-zero-filled"

    loaded = _IntegerZeroFilledLoaded


def two_integers_read_together() -> ProgramSpec:
    """A program whose second call reads two integer constants at once (a literal and a buffer): what
    IntegerConstantsZeroFilled gets wrong in one call, each wrong value another zero-filled tensor's."""
    return ProgramSpec(
        methods=(
            Method("prefill", (Constant("w", "parameter"),), reads=("w",)),
            Method(
                "forward",
                (
                    Constant("w", "attribute", "float16"),
                    Constant("_tensor_constant0", "literal", "int32", (16,)),
                    Constant("weight", "buffer", "int16"),
                ),
                reads=("w", "_tensor_constant0", "weight"),
            ),
        ),
        calls=("prefill", "forward"),
    )


class _ByNameOnLateLoadLoaded(ReferenceLoaded):
    """Up-front loads bind from the package; once a method has run, a method loaded later looks its
    constants up by name among those already loaded."""

    def run(self, method: str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        self.load_method(method)
        self.__dict__["_ran"] = True
        return super().run(method, inputs)

    def bind(self, method: str, key: str, final: str) -> torch.Tensor:
        by_name = self.__dict__.setdefault("_by_name", {})
        if self.__dict__.get("_ran") and key in by_name:
            return by_name[key]
        bound = super().bind(method, key, final)
        by_name.setdefault(key, bound)
        return bound


class ByNameOnLateLoad(_WithLoader):
    """By-name binding on the lazy path only: a method loaded at its first call, after another method has
    run (extension.module's way), binds constants by name; all methods loaded up front are right."""

    name = "corpus-by-name-late-load"

    loaded = _ByNameOnLateLoadLoaded


class _LeafNameLoaded(ReferenceLoaded):
    """Binds each constant by the last part of its path, program-wide: the first load of a leaf wins."""

    def bind(self, method: str, key: str, final: str) -> torch.Tensor:
        by_leaf = self.__dict__.setdefault("_by_leaf", {})
        leaf = key.rpartition(".")[2]
        if leaf not in by_leaf:
            by_leaf[leaf] = super().bind(method, key, final)
        return by_leaf[leaf]


class LeafNameBinding(_WithLoader):
    """A constant cache keyed by the last part of a constant's path, as a runtime that flattens module paths
    keys it (``layers.0.weight`` and ``layers.1.weight`` are both ``weight``): in one method, every layer
    reads the first layer's weight."""

    name = "corpus-leaf-name"

    loaded = _LeafNameLoaded


def _row_major(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory read row-major from its offset: what a packer that ignores strides writes."""
    return t.as_strided(t.shape, torch.empty(t.shape).stride(), t.storage_offset()).clone()


class StrideBlindPacker(ReferenceBackend):
    """A packer that writes each tensor's memory as it lies, from its offset, as if it were row-major: a
    transposed or strided weight is stored as other values (a tied ``lm_head`` as the embedding it views)."""

    name = "corpus-stride-blind"

    def plan(self, methods: Uses) -> PackagePlan:
        plan = planner.plan_package(methods)
        plan.entries = {k: _row_major(t) for k, t in plan.entries.items()}
        return plan


class _FineClosenessCache(_ClosenessCache):
    tolerance = 1e-3


class FineClosenessDedupe(_Loader):
    """A dedupe by closeness at rtol = atol = 1e-3: a fine-tuned weight that moved less than that from its
    base is taken for it."""

    name = "corpus-closeness-fine"

    def make_cache(self):
        return _FineClosenessCache()


class _KeyedCache:
    """Shares a constant with the first one cached under its key: what a loader leaves out of the key is
    its defect."""

    def __init__(self):
        self._tensors = {}

    def key(self, host):
        raise NotImplementedError

    def share(self, host, materialize):
        key = self.key(host)
        if key not in self._tensors:
            self._tensors[key] = materialize(host)
        return self._tensors[key]


class _ShapeBlindCache(_KeyedCache):
    """Keyed by dtype and a digest of the bytes: the shape is left out."""

    def key(self, host):
        return host.dtype, content.digest(host)


class ShapeBlindDedupe(_Loader):
    """Immutable constants deduplicated by dtype and bytes, the shape left out: a (4, 4) weight and a (16,)
    one of the same bytes become one tensor."""

    name = "corpus-shape-blind"

    def make_cache(self):
        return _ShapeBlindCache()


class _SortedDigestCache(_KeyedCache):
    """Keyed by dtype, shape and a digest of the sorted values: the order of the elements is left out."""

    def key(self, host):
        ordered = host.reshape(-1).sort().values if host.numel() else host
        return host.dtype, tuple(host.shape), content.digest(ordered)


class SortedDigestDedupe(_Loader):
    """A dedupe keyed on a digest of each tensor's sorted values (order-free, to hash fast in parallel): a
    square weight and its transpose become one tensor."""

    name = "corpus-sorted-digest"

    def make_cache(self):
        return _SortedDigestCache()


class _StateDedupedLoaded(ReferenceLoaded):
    """Binds an immutable constant to the program's state of the same bytes (content dedupe run over state
    too, P5 broken at load): the constant then follows the state's writes."""

    def bind(self, method: str, key: str, final: str) -> torch.Tensor:
        host = self.package_tensor(final)
        for state in self._state.values():
            if content.same_content(state, host):
                return state
        return super().bind(method, key, final)


class ConstantBoundToState(_WithLoader):
    """A loader whose dedupe takes a constant for the state whose initial bytes it equals (the class of
    executorch's emitter bug giving a buffer a constant's index:
    docs/findings/shared-state-private-state.md)."""

    name = "corpus-constant-in-state"

    loaded = _StateDedupedLoaded


class _StateByLeafLoaded(ReferenceLoaded):
    """Keys state by the last part of its path: one memory for every layer's ``k_cache``."""

    def _initial_state(self) -> dict[str, torch.Tensor]:
        state = super()._initial_state()
        by_leaf: dict[str, torch.Tensor] = {}
        return {k: by_leaf.setdefault(k.rpartition(".")[2], t) for k, t in state.items()}


class StateByLeaf(_WithLoader):
    """State keyed by its leaf name, as a runtime that names a KV cache ``k_cache`` whatever its layer: the
    layers' caches are one memory."""

    name = "corpus-state-by-leaf"

    loaded = _StateByLeafLoaded


PTN_CI_FUZZ = ("test_fuzz.py", "--ptn-fuzz-profile=ptn-ci")
"""The CI fuzz, as a ``Defect.ci``."""


@dataclass(frozen=True)
class Defect:
    """One corpus member: a broken backend and the ground truth of catching it."""

    backend: type[ReferenceBackend]
    name: str
    """After the upstream issue, PR or pattern it comes from."""
    origin: str
    """Where it comes from, in one line, with a link where one exists."""
    kinds: frozenset[Kind]
    """A failure that catches it carries a mechanism of one of these kinds."""
    ci: tuple[str, ...]
    """The smallest selection that catches it in CI: a test file of the suite (conformance/), then its
    pytest options (``-k``, the fuzz profile)."""
    pending: str = ""
    """Why CI does not catch it yet (empty: it does); its test is a strict expected failure meanwhile."""

    @property
    def option(self) -> str:
        """Its ``--ptn-backend`` value."""
        return f"--ptn-backend=defect_corpus:{self.backend.__name__}"

    def ci_args(self, suite: Path) -> list[str]:
        """``ci`` as pytest arguments, the file found in ``suite``."""
        file, *options = self.ci
        return [str(suite / file), *options]


EXECUTION = "test_execution.py"

CORPUS: tuple[Defect, ...] = (
    Defect(
        BindsByKey,
        "constant cache keyed by name",
        "the CUDA delegate shares constants across methods by name (before "
        "https://github.com/pytorch/executorch/pull/21959)",
        frozenset({Kind.BY_NAME}),
        (EXECUTION, "-k", "matches_eager and colliding_literals-up_front"),
    ),
    Defect(
        MetadataOnly,
        "metadata-only check (PR #21959)",
        "the CUDA delegate compares dtype, sizes and strides of a cached constant, never its bytes: "
        "https://github.com/pytorch/executorch/pull/21959",
        frozenset({Kind.BY_NAME, Kind.LOOKALIKE}),
        (EXECUTION, "-k", "matches_eager and same_metadata_different_bytes-up_front"),
    ),
    Defect(
        TrustsCachedNames,
        "total collision unchecked (PR #21959)",
        "the CUDA delegate skips the check when every constant name of a method is already cached: "
        "https://github.com/pytorch/executorch/pull/21959",
        frozenset({Kind.BY_NAME}),
        (EXECUTION, "-k", "matches_eager and total_collision-up_front"),
    ),
    Defect(
        GeneratedNamesOnly,
        "generated names only namespaced (PR #21823)",
        "the CUDA backend namespaces _tensor_constant* per AOTI library, other names stay keyed by FQN: "
        "https://github.com/pytorch/executorch/pull/21823",
        frozenset({Kind.BY_NAME}),
        (EXECUTION, "-k", "matches_eager and colliding_literals-up_front"),
    ),
    Defect(
        DtypeBlindDedupe,
        "dtype-blind dedupe",
        "immutable constants deduplicated by content (https://github.com/pytorch/executorch/pull/23891), "
        "the key taken as shape and bytes",
        frozenset({Kind.LOOKALIKE}),
        (EXECUTION, "-k", "matches_eager and zero_caches_two_dtypes-up_front"),
    ),
    Defect(
        StateCopiedPerMethod,
        "private copy of shared state",
        "the legacy ExecuTorch Module API (_load_for_executorch) gives each method its own mutable buffers "
        "(https://github.com/pytorch/executorch/issues/17005)",
        frozenset({Kind.PRIVATE_COPY}),
        (EXECUTION, "-k", "matches_eager and kv_cache-up_front"),
    ),
    Defect(
        ProcessWideByName,
        "cache outlives its program",
        "the CUDA delegate's constant cache is process-wide and keyed by name; "
        "https://github.com/pytorch/executorch/pull/21823 scopes it to one loaded model",
        frozenset({Kind.BY_NAME}),
        ("test_sharing.py", "-k", "do_not_leak and colliding_literals and not in_bf16 and not in_fp16"),
    ),
    Defect(
        IntegerConstantsZeroFilled,
        "integer constants zero-filled",
        "constant data copied for floating dtypes only (to_native ships no data for non-persistent buffers, "
        "which start at zero)",
        frozenset({Kind.ZERO_FILLED}),
        (EXECUTION, "-k", "matches_eager and equal_bytes_two_dtypes-up_front"),
    ),
    Defect(
        ByNameOnLateLoad,
        "by-name binding on lazy load",
        "a method loaded at its first call, after another has run (extension.module), binds by name",
        frozenset({Kind.BY_NAME}),
        (EXECUTION, "-k", "matches_eager and colliding_literals-at_first_call"),
    ),
    Defect(
        ReinitOnLateLoad,
        "state re-initialised on method load (share_mutable_buffers)",
        "load_method copies initial values into the shared buffer again: "
        "https://github.com/pytorch/executorch/pull/21958",
        frozenset({Kind.REINITIALISED}),
        (EXECUTION, "-k", "matches_eager and kv_cache_in_fp16-at_first_call"),
    ),
    Defect(
        PrefixDigestCache,
        "digest of a prefix",
        "weights keyed by a digest of their bytes (https://github.com/pytorch/executorch/pull/21823), taken "
        "over the first KiB only",
        frozenset({Kind.LOOKALIKE}),
        (EXECUTION, "-k", "matches_eager and near_equal_weights-up_front"),
    ),
    # Only constants closer than its 1e-2 but farther apart than the suite's comparison bound (1e-5 for
    # float32, pytest_ptn.instruments.comparison) show: below that bound a closeness dedupe is invisible by
    # construction, and harmless.
    Defect(
        LeafNameBinding,
        "constant bound by the last part of its path",
        "a runtime that flattens module paths keys constants by leaf name; every transformer holds "
        "layers.0.weight beside layers.1.weight (issue 67)",
        frozenset({Kind.BY_NAME}),
        (EXECUTION, "-k", "matches_eager and nested_layers-up_front"),
    ),
    Defect(
        StrideBlindPacker,
        "packer that ignores strides",
        "a packer that writes a tensor's memory as it lies: a tied lm_head stored as the embedding's "
        "transpose, a slice of a fused qkv (issue 67)",
        frozenset({Kind.LAYOUT_LOST}),
        (EXECUTION, "-k", "matches_eager and strided_weights-up_front"),
    ),
    Defect(
        FineClosenessDedupe,
        "dedupe by closeness at 1e-3",
        "a dedupe by torch.allclose (rtol = atol = 1e-3): a fine-tuned weight moved by less is taken for its "
        "base (issue 67)",
        frozenset({Kind.LOOKALIKE}),
        (EXECUTION, "-k", "matches_eager and close_weights-up_front"),
    ),
    Defect(
        ShapeBlindDedupe,
        "dedupe keyed without the shape",
        "immutable constants deduplicated by dtype and bytes "
        "(https://github.com/pytorch/executorch/pull/23891 keyed without the shape): one byte pattern under "
        "two shapes becomes one tensor (issue 67)",
        frozenset({Kind.LOOKALIKE, Kind.SHARES_DIFFERING}),
        ("test_sharing.py", "-k", "lookalike_content and equal_bytes_two_shapes"),
    ),
    Defect(
        SortedDigestDedupe,
        "dedupe by a digest of sorted values",
        "a dedupe keyed on an order-free digest of the values: a square weight and its transpose (issue 67)",
        frozenset({Kind.LOOKALIKE}),
        (EXECUTION, "-k", "matches_eager and reordered_weights-up_front"),
    ),
    Defect(
        ConstantBoundToState,
        "constant bound to state of its bytes",
        "a dedupe over constants and state: the class of executorch's emitter giving a buffer a constant's "
        "index when their bytes are equal (docs/findings/shared-state-private-state.md; issue 67)",
        frozenset({Kind.CONSTANT_STATE}),
        (EXECUTION, "-k", "matches_eager and constant_equal_to_state-up_front"),
    ),
    Defect(
        StateByLeaf,
        "state keyed by its leaf name",
        "a runtime that names a KV cache by its leaf (k_cache) whatever its layer: the layers' caches are "
        "one memory (issue 67)",
        frozenset({Kind.ONE_MEMORY}),
        (EXECUTION, "-k", "matches_eager and per_layer_caches-up_front"),
    ),
    Defect(
        ClosenessDedupe,
        "dedupe by closeness",
        "a dedupe by torch.allclose (rtol = atol = 1e-2): a fine-tuned weight taken for its base's",
        frozenset({Kind.LOOKALIKE}),
        PTN_CI_FUZZ,
    ),
)
