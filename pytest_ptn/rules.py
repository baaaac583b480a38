"""The packaging and loader-sharing rules of SPEC section 2 in plain torch (the reference implementation).

``plan_package`` decides final names, stored entries, aliases and state keys for a multi-method program;
P1, P2, P4 and P5 hold by construction and P6, P7, P8 raise. ``SharingCache`` is the content-addressed cache
a loader shares constants through (S1-S3, S6).
"""

from __future__ import annotations

import hashlib
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

    state: dict[str, tuple[str, torch.Tensor]] = {}
    for method, uses in methods.items():
        for key, use in uses.items():
            if key not in mutable:
                continue
            if key not in state:
                state[key] = (method, use.tensor)
                continue
            first, t = state[key]
            what = _difference(t, use.tensor)
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
        owner = by_content.setdefault((t.dtype, tuple(t.shape), digest(t)), final)
        if owner == final:
            entries[final] = t
        else:
            aliases[final] = owner
    return PackagePlan(bindings, entries, aliases, frozenset(f"{STATE}/{k}" for k in state))


def _difference(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} vs {b.dtype}"
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    if digest(a) != digest(b):
        return "initial bytes differ"
    return ""


class SharingCache:
    """Constants shared across the methods (and programs) a loader loads, addressed by content.

    A constant is shared only when dtype, shape, strides and the digest of its bytes agree (S1, S2), whether
    or not its name was seen before (S3). The digest comes from the host bytes the loader read anyway, once
    per constant, so deciding never re-uploads or re-reads device memory (S6). Only immutable constants
    belong here: state is per loaded program.
    """

    def __init__(self) -> None:
        self._tensors: dict[ContentKey, torch.Tensor] = {}
        self.materialized_bytes = 0

    def share(
        self, host: torch.Tensor, materialize: Callable[[torch.Tensor], torch.Tensor] = torch.clone
    ) -> torch.Tensor:
        """The cached tensor with ``host``'s content, materializing ``host`` only on a miss."""
        key = ContentKey.of(host)
        cached = self._tensors.get(key)
        if cached is None:
            cached = self._tensors[key] = materialize(host)
            self.materialized_bytes += cached.untyped_storage().nbytes()
        return cached

    def __len__(self) -> int:
        return len(self._tensors)
