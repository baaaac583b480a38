"""A derandomized profile's programs as one fixed sequence, so a verdict never depends on how a run is
split: program ``i`` is drawn from bytes made from ``i`` alone (hypothesis's ``fuzz_one_input``), and each
share of the run (an xdist worker of a ``--ptn-shard`` machine) judges the programs whose index it owns.
Hypothesis's own search draws each share's programs from that share's seed: -n 2 and no -n would judge
other programs, and a listed bug one of them shows would pass on one runner and fail on another."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from typing import Any

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup  # hypothesis's own dependency there

TRIES = 20
"""Byte strings tried for one program before giving up: one a draw cannot use (too short for it) is rare."""
SIZE = 8192
"""Bytes offered to one draw: far more than a program of the fuzz's menu reads."""


def program_bytes(i: int, attempt: int = 0) -> bytes:
    """The bytes program ``i`` is drawn from (its ``attempt``-th try): the same on every machine."""
    seed = f"pytest-ptn program {i} try {attempt}".encode()
    blocks = (hashlib.sha256(seed + k.to_bytes(4, "big")).digest() for k in range(SIZE // 32))
    return b"".join(blocks)


def owned(index: int, shares: int, count: int) -> range:
    """The indices of the programs share ``index`` of ``shares`` judges, of ``count`` in all."""
    return range(index, count, shares)


def judged_in_turn(test: Any, programs: range) -> Callable[[], None]:
    """``test`` (a ``@given`` test of one argument) as a function judging ``programs`` of the sequence in
    turn. Every program is judged; the first failure of each exception type is raised after the last (two
    types: a group of both), as hypothesis reports distinct failures."""

    def run() -> None:
        failures: dict[type[BaseException], Exception] = {}
        for i in programs:
            for attempt in range(TRIES):
                try:
                    if test.hypothesis.fuzz_one_input(program_bytes(i, attempt)) is not None:
                        break
                except Exception as e:
                    failures.setdefault(type(e), e)
                    break
            else:
                raise RuntimeError(f"program {i} of the sequence: no draw in {TRIES} tries")
        found = list(failures.values())
        if len(found) == 1:
            raise found[0]
        if found:
            raise BaseExceptionGroup(f"{len(found)} distinct failures in the fixed sequence", found)

    return run
