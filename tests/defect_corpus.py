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
    _WithLoader,
)

from pytest_ptn.backends.reference import ReferenceBackend
from pytest_ptn.mechanisms import Kind
from pytest_ptn.reference.loader import ReferenceLoaded
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
        PTN_CI_FUZZ,
    ),
    # Only constants closer than its 1e-2 but farther apart than the suite's comparison bound (1e-5 for
    # float32, pytest_ptn.instruments.comparison) show: below that bound a closeness dedupe is invisible by
    # construction, and harmless.
    Defect(
        ClosenessDedupe,
        "dedupe by closeness",
        "a dedupe by torch.allclose (rtol = atol = 1e-2): a fine-tuned weight taken for its base's",
        frozenset({Kind.LOOKALIKE}),
        PTN_CI_FUZZ,
    ),
)
