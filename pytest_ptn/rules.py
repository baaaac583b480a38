"""The packaging and loader-sharing rules of SPEC section 2 in plain torch (the reference implementation).

``plan_package`` decides final names, stored entries, aliases and state keys for a multi-method program;
P1, P2, P4 and P5 hold by construction and P6, P7, P8 raise. ``SharingCache`` is the content-addressed cache
a loader shares constants through (S1-S3, S6).
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

STATE = "state"
"""The reserved namespace of mutable keys (P2, P6)."""


class PackagingError(ValueError):
    """A program the rules reject. Carries the method(s) and key(s) it names in its message (X1)."""

    def __init__(self, message: str, methods: tuple[str, ...], keys: tuple[str, ...]):
        super().__init__(message)
        self.methods = methods
        self.keys = keys


class ReservedNamespaceError(PackagingError):
    """P6: a method named ``state`` would share a namespace with the program's mutable keys."""


class StateConflictError(PackagingError):
    """P7: methods disagree on a mutable key's dtype, shape or initial bytes."""


class FinalNameCollisionError(PackagingError):
    """P8: two (method, key) pairs map to one final name."""


@dataclass(frozen=True)
class ConstantUse:
    """A constant as one method binds it."""

    tensor: torch.Tensor
    mutable: bool = False


@dataclass(frozen=True)
class ContentKey:
    """What must agree for two tensors to share one storage: metadata and a digest of the bytes."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    digest: str

    @classmethod
    def of(cls, t: torch.Tensor) -> ContentKey:
        return cls(t.dtype, tuple(t.shape), tuple(t.stride()), digest(t))


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's bytes in logical (row-major) order, read from host memory without a device copy."""
    flat = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data if flat.numel() else memoryview(b"")


def digest(t: torch.Tensor) -> str:
    if t.device.type != "cpu":
        raise ValueError(
            "digest a constant from its host bytes; reading it back from the device is what S6 forbids"
        )
    return hashlib.sha256(tensor_bytes(t)).hexdigest()


def same_content(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and digest(a) == digest(b)


@dataclass
class PackagePlan:
    """Where every constant of every method goes in the package."""

    bindings: dict[str, dict[str, str]]
    """method -> key as the method names it -> final name."""
    entries: dict[str, torch.Tensor]
    """final name -> data, for owners only (unique immutable tensors and state)."""
    aliases: dict[str, str]
    """final name -> the owner whose bytes it shares (byte-identical immutable tensors, P4)."""
    state_keys: frozenset[str] = field(default_factory=frozenset)


def final_name(method: str, key: str, mutable_keys: frozenset[str] | set[str]) -> str:
    return f"{STATE}/{key}" if key in mutable_keys else f"{method}/{key}"


def plan_package(methods: Mapping[str, Mapping[str, ConstantUse]]) -> PackagePlan:
    """Plan a package for ``methods`` (method -> key -> use); raise a PackagingError for P6, P7, P8."""
    for method, uses in methods.items():
        if method == STATE or method.startswith(f"{STATE}/"):
            raise ReservedNamespaceError(
                f"method {method!r} is in the reserved namespace '{STATE}/' of the program's mutable keys "
                f"(it binds {sorted(uses)})",
                (method,),
                tuple(sorted(uses)),
            )
    mutable = {k for uses in methods.values() for k, u in uses.items() if u.mutable}
    digest_of = _memoized_digest()

    state: dict[str, tuple[str, torch.Tensor]] = {}
    for method, uses in methods.items():
        for key, use in uses.items():
            if key not in mutable:
                continue
            if key not in state:
                state[key] = (method, use.tensor)
                continue
            first, t = state[key]
            what = _difference(t, use.tensor, digest_of)
            if what:
                raise StateConflictError(
                    f"mutable key {key!r} differs between methods {first!r} and {method!r}: {what}",
                    (first, method),
                    (key,),
                )

    bindings: dict[str, dict[str, str]] = {}
    owners_of: dict[str, tuple[str, str]] = {}
    for method, uses in methods.items():
        bindings[method] = {}
        for key in uses:
            final = final_name(method, key, mutable)
            bindings[method][key] = final
            if key in mutable:
                continue
            other = owners_of.setdefault(final, (method, key))
            if other != (method, key):
                raise FinalNameCollisionError(
                    f"method {other[0]!r} key {other[1]!r} and method {method!r} key {key!r} "
                    f"both map to {final!r}",
                    (other[0], method),
                    (other[1], key),
                )

    entries: dict[str, torch.Tensor] = {f"{STATE}/{k}": t for k, (_, t) in state.items()}
    aliases: dict[str, str] = {}
    by_content: dict[tuple[torch.dtype, tuple[int, ...], str], str] = {}
    for final in sorted(owners_of):
        method, key = owners_of[final]
        t = methods[method][key].tensor
        owner = by_content.setdefault((t.dtype, tuple(t.shape), digest_of(t)), final)
        if owner == final:
            entries[final] = t
        else:
            aliases[final] = owner
    return PackagePlan(bindings, entries, aliases, frozenset(f"{STATE}/{k}" for k in state))


def _memoized_digest() -> Callable[[torch.Tensor], str]:
    """``digest`` that hashes each tensor once per plan: a weight bound by M methods is one tensor under M
    (method, key) pairs, and hashing it M times made dedupe cost M passes over the shared bytes.

    Keyed by everything that decides the bytes: storage, offset, shape, strides, dtype, the conjugate and
    negative bits, and the version counter (an in-place write bumps it; inference tensors have none, so
    they are hashed every time). The memo holds each tensor it keyed, so no storage address is freed and
    reused by another tensor while the plan runs.
    """
    memo: dict[tuple[object, ...], tuple[torch.Tensor, str]] = {}

    def cached(t: torch.Tensor) -> str:
        if t.is_inference():
            return digest(t)
        key = (
            t.untyped_storage().data_ptr(),
            t.storage_offset(),
            tuple(t.shape),
            t.stride(),
            t.dtype,
            t.is_conj(),
            t.is_neg(),
            t._version,
        )
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = (t, digest(t))
        return hit[1]

    return cached


def _difference(a: torch.Tensor, b: torch.Tensor, digest_of: Callable[[torch.Tensor], str]) -> str:
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} vs {b.dtype}"
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    if digest_of(a) != digest_of(b):
        return "initial bytes differ"
    return ""


class SharingCache:
    """Constants shared across the methods (and programs) a loader loads, addressed by content.

    A constant is shared only when dtype, shape, strides and the digest of its bytes agree (S1, S2), whether
    or not its name was seen before (S3). The digest comes from the host bytes the loader read anyway, once
    per constant, so deciding never re-uploads or re-reads device memory (S6). Only immutable constants
    belong here: state is per loaded program. Lookup and insert happen under one lock, so threads loading
    at once make one copy of each content (S7); keys are computed outside it, so they still hash in parallel.
    """

    def __init__(self) -> None:
        self._tensors: dict[ContentKey, torch.Tensor] = {}
        self._keys: dict[int, tuple[weakref.ref[torch.Tensor], int, ContentKey]] = {}
        self._lock = threading.Lock()
        self.materialized_bytes = 0

    def share(
        self,
        host: torch.Tensor,
        materialize: Callable[[torch.Tensor], torch.Tensor] = torch.clone,
        key: ContentKey | None = None,
    ) -> torch.Tensor:
        """The cached tensor with ``host``'s content, materializing ``host`` only on a miss.

        ``key`` is ``host``'s ContentKey when the loader already has it (digests recorded next to the bytes
        it loads, as the aoti compile cache does); it must be the key of exactly these bytes.
        """
        if key is None:
            key = self.key(host)
        with self._lock:  # a check-then-insert race made two threads each materialize one content (S7)
            cached = self._tensors.get(key)
            if cached is None:
                cached = self._tensors[key] = materialize(host)
                self.materialized_bytes += cached.untyped_storage().nbytes()
        return cached

    def key(self, host: torch.Tensor) -> ContentKey:
        """``ContentKey.of(host)``, computed once per host tensor: every alias of a package owner resolves
        to one host tensor, so a weight bound by M methods would otherwise be hashed M times per load.

        Remembered by identity (a weak reference, so the memo never keeps a host alive and a recycled id
        is never taken for the old tensor) and version counter, so an in-place write is hashed afresh.
        Writes that bypass the counter (through ``.numpy()`` or ``.data``) are not seen: a loader's host
        tensors are bytes it read and never writes. Inference tensors have no counter: hashed every time.
        """
        if host.is_inference():
            return ContentKey.of(host)
        memo = self._keys.get(id(host))
        if memo is not None and memo[0]() is host and memo[1] == host._version:
            return memo[2]
        key = ContentKey.of(host)
        self._keys[id(host)] = (weakref.ref(host, _forget(self._keys, id(host))), host._version, key)
        return key

    def __len__(self) -> int:
        return len(self._tensors)


def _forget(
    keys: dict[int, tuple[weakref.ref[torch.Tensor], int, ContentKey]], ident: int
) -> Callable[[weakref.ref[torch.Tensor]], None]:
    """A weakref callback dropping a dead host's memo entry (unless a new tensor with its id replaced it)."""

    def forget(ref: weakref.ref[torch.Tensor]) -> None:
        entry = keys.get(ident)
        if entry is not None and entry[0] is ref:
            del keys[ident]

    return forget
