"""The packaging rules of SPEC section 2 in plain torch: the reference planner.

``plan_package`` decides final names, stored entries, aliases and state keys for a multi-method program;
P1, P2, P4 and P5 hold by construction and P6, P7, P8 raise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from pytest_ptn.instruments.content import memoized_digest

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
    state = shared_state(methods)
    digest_of = memoized_digest()

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


def shared_state(methods: Mapping[str, Mapping[str, ConstantUse]]) -> dict[str, tuple[str, torch.Tensor]]:
    """Mutable key -> the first method binding it and its initial value, one per key across methods; raise
    StateConflictError (P7) naming the key and two methods that disagree on it."""
    mutable = {k for uses in methods.values() for k, u in uses.items() if u.mutable}
    digest_of = memoized_digest()
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
    return state


def _difference(a: torch.Tensor, b: torch.Tensor, digest_of: Callable[[torch.Tensor], str]) -> str:
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} vs {b.dtype}"
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    if digest_of(a) != digest_of(b):
        return "initial bytes differ"
    return ""
