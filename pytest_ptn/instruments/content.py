"""Content identity of tensors: their bytes, digest and ContentKey, and the cache that shares by content.

A digest is taken from host bytes only (S6). ``SharingCache`` is the content-addressed cache a loader shares
constants through (S1-S3, S6, S7); the planner, the exported-program reader and the aoti cache key by the
same digest.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch


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
    return host_memory(flat) if flat.numel() else memoryview(b"")


def host_memory(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor's memory, zero-copy and writable; the view keeps ``t`` alive.
    Through ctypes, not ``Tensor.numpy()``: torch does not require numpy, and a GPU runner may lack it."""
    assert t.device.type == "cpu" and t.is_contiguous(), (t.device, t.stride())
    memory = (ctypes.c_ubyte * t.nbytes).from_address(t.data_ptr())
    memory.owner = t  # type: ignore[attr-defined]
    return memoryview(memory).cast("B")


def digest(t: torch.Tensor) -> str:
    if t.device.type != "cpu":
        raise ValueError(
            "digest a constant from its host bytes; reading it back from the device is what S6 forbids"
        )
    return hashlib.sha256(tensor_bytes(t)).hexdigest()


def same_content(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and digest(a) == digest(b)


def memoized_digest() -> Callable[[torch.Tensor], str]:
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
