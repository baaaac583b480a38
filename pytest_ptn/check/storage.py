"""S1-S3, S5 and S7 on a program's storage view: check_program's findings, and the conformance S tests'
verdicts."""

from __future__ import annotations

import concurrent.futures

from pytest_ptn.backend import Backend, Loaded, Lowered
from pytest_ptn.check.findings import Finding, Stage
from pytest_ptn.mechanisms import Kind, Mechanism
from pytest_ptn.programs.exported import aliases, constants_of, immutable_by_content, mutable_keys, read_keys

Pair = tuple[str, str]
Groups = dict[tuple[str, str], list[Pair]]
"""(dtype and shape, digest) -> the (method, key) pairs holding that tensor: immutable_by_content."""


def topology(loaded: Loaded, programs: dict) -> dict[Pair, int]:
    """(method, immutable key the method reads) -> the allocation behind it; one key per tensor. A key the
    method's graph never reads (a parameter of the module that another method uses, a second FQN of one
    tensor, see aliases) need not be allocated at all, so it has no place in the topology. In the order the
    exported programs list their constants: which of two keys sharing one allocation a finding names first
    is the same in every run."""
    mutable = mutable_keys(programs)
    return {
        (method, key): loaded.storage(method, key)
        for method, ep in programs.items()
        for key in constants_of(ep)
        if key in read_keys(ep) and key not in mutable and key not in aliases(ep)
    }


def partition(storages: dict[Pair, int]) -> set[frozenset[Pair]]:
    groups: dict[int, set[Pair]] = {}
    for pair, storage in storages.items():
        groups.setdefault(storage, set()).add(pair)
    return {frozenset(g) for g in groups.values()}


CONCURRENT_ATTEMPTS = 16
"""How many times S7 loads every method at once before it passes. A check-then-insert race shows only when
the threads interleave just so: one try passes or fails by chance, and a baseline taken from one run would
not hold for the next."""


def concurrent_partition(backend: Backend, lowered: Lowered, programs: dict) -> set[frozenset[Pair]]:
    """The sharing topology when every method of ``lowered`` loads at once, each from its own thread, in a
    new instance of ``backend`` (empty caches, so the threads race to fill them)."""
    loaded = type(backend)().load(lowered)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(programs)) as pool:
        list(pool.map(loaded.load_method, list(programs)))
    return partition(topology(loaded, programs))


def concurrent_change(
    backend: Backend, lowered: Lowered, programs: dict, sequential: set[frozenset[Pair]]
) -> str | None:
    """S7, judged once for the conformance test and check_program: the first of up to CONCURRENT_ATTEMPTS
    concurrent loads whose topology differs from ``sequential``, said; None where none does."""
    for attempt in range(1, CONCURRENT_ATTEMPTS + 1):
        if concurrent_partition(backend, lowered, programs) != sequential:
            tries = f"in concurrent load {attempt} of up to {CONCURRENT_ATTEMPTS}"
            return f"threads change the sharing topology ({tries})"
    return None


def storage_findings(storages: dict[Pair, int], programs: dict) -> list[Finding]:
    groups = immutable_by_content(programs)
    return [*split_identical_findings(storages, groups), *shared_differing_findings(storages, groups)]


def split_identical_findings(storages: dict[Pair, int], groups: Groups) -> list[Finding]:
    """S1: identical constants of several methods in one allocation (``groups``: immutable_by_content)."""
    findings = []
    for held in groups.values():
        pairs = [p for p in held if p in storages]  # the keys read
        allocations = {storages[p] for p in pairs}
        if len({m for m, _ in pairs}) > 1 and len(allocations) > 1:
            said = f"identical constants {pairs} occupy {len(allocations)} allocations"
            findings.append(
                Finding("S1", Stage.STORAGE, said, mechanisms=(Mechanism(Kind.NOT_SHARED, None, said),))
            )
    return findings


def shared_differing_findings(storages: dict[Pair, int], groups: Groups) -> list[Finding]:
    """Different constants never in one allocation (``groups``: immutable_by_content): S2, or S3 when every
    immutable name of the later method (``storages`` in load order) was already loaded by earlier ones."""
    content = {pair: c for c, pairs in groups.items() for pair in pairs}
    earlier: set[str] = set()
    totally_collided = set()
    for method in dict.fromkeys(m for m, _ in storages):
        keys = {k for m, k in storages if m == method}
        if keys <= earlier:
            totally_collided.add(method)
        earlier |= keys
    findings = []
    owner: dict[int, Pair] = {}
    for pair in storages:
        first = owner.setdefault(storages[pair], pair)
        if first != pair and content[first] != content[pair]:
            rule = "S3" if pair[0] in totally_collided else "S2"
            detail = f"key {pair[1]!r} shares storage with method {first[0]!r}'s {first[1]!r}, other bytes"
            # the same name: a binding by name, the loader's one defect whatever the tensor; another name:
            # sharing on less than the content
            kind = Kind.BY_NAME if pair[1] == first[1] else Kind.SHARES_DIFFERING
            how = Mechanism(
                kind, None, f"method {pair[0]!r}'s {pair[1]!r} is method {first[0]!r}'s {first[1]!r}"
            )
            findings.append(Finding(rule, Stage.STORAGE, detail, pair[0], mechanisms=(how,)))
    return findings
