"""S1, S2/S3 and S5 on the user's program, read from the loader's storage view."""

from __future__ import annotations

from pytest_ptn.backend import Loaded
from pytest_ptn.check.findings import Finding, Stage
from pytest_ptn.programs.exported import constants_of, immutable_by_content, mutable_keys

Pair = tuple[str, str]


def topology(loaded: Loaded, programs: dict) -> dict[Pair, int]:
    """(method, immutable key) -> the allocation behind it."""
    mutable = mutable_keys(programs)
    return {
        (method, key): loaded.storage(method, key)
        for method, ep in programs.items()
        for key in constants_of(ep)
        if key not in mutable
    }


def partition(storages: dict[Pair, int]) -> set[frozenset[Pair]]:
    groups: dict[int, set[Pair]] = {}
    for pair, storage in storages.items():
        groups.setdefault(storage, set()).add(pair)
    return {frozenset(g) for g in groups.values()}


def storage_findings(storages: dict[Pair, int], programs: dict) -> list[Finding]:
    """Identical constants of several methods in one allocation (S1), and never different ones (S2; S3 when
    every immutable name of the later method was already loaded by earlier ones)."""
    groups = immutable_by_content(programs)
    content = {pair: c for c, pairs in groups.items() for pair in pairs}
    findings = []
    for pairs in groups.values():
        allocations = {storages[p] for p in pairs}
        if len({m for m, _ in pairs}) > 1 and len(allocations) > 1:
            findings.append(
                Finding(
                    "S1", Stage.STORAGE, f"identical constants {pairs} occupy {len(allocations)} allocations"
                )
            )
    earlier: set[str] = set()
    totally_collided = set()
    for method in programs:
        keys = {k for m, k in storages if m == method}
        if keys and keys <= earlier:
            totally_collided.add(method)
        earlier |= keys
    owner: dict[int, Pair] = {}
    for pair in storages:
        first = owner.setdefault(storages[pair], pair)
        if first != pair and content[first] != content[pair]:
            rule = "S3" if pair[0] in totally_collided else "S2"
            detail = f"key {pair[1]!r} shares storage with method {first[0]!r}'s {first[1]!r}, other bytes"
            findings.append(Finding(rule, Stage.STORAGE, detail, pair[0]))
    return findings
