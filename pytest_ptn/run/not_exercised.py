"""A test of how the backend holds a program's constants (ruleset.JUDGE_HELD_CONSTANTS) that passed on a
program whose constants the backend under test held none of ends "not exercised", never passed: a delegate
that took nothing would otherwise pass every isolation and sharing test on the merits of the portable kernels
around it (Spec v6). What the backend held comes from the lowered program (``Lowered.ownership``); a backend
that does not say is unknown, and its tests keep their outcome."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from pytest_ptn.ruleset import JUDGE_HELD_CONSTANTS

HELD = pytest.StashKey[tuple[int, int]]()
"""On a test that judges several programs itself (the fuzz): (constants the backend held, constants in all)
over the programs whose lowering said, summed; the plugin reads it as it reads a case's."""

NOT_EXERCISED_PREFIX = "not exercised"
"""How a not exercised test's reason starts, for people; the reports tell the outcome by the plugin's mark
(``run.not_applicable.OUTCOME_PROPERTY``), never by these words."""


def unexercised(rules: Iterable[str], held: int, checked: int) -> bool:
    """Whether a passed test of ``rules`` did not exercise the backend: it judges only how constants are
    held, and the backend held none of the ``checked`` ones."""
    rules = set(rules)
    return bool(rules) and rules <= JUDGE_HELD_CONSTANTS and checked > 0 and held == 0


def reason(backend: str, checked: int) -> str:
    """The skip reason of a test that did not exercise ``backend``."""
    return (
        f"{NOT_EXERCISED_PREFIX}: {backend} held none of the program's {checked} constants (its partitioners "
        "took none): what the test checked ran outside it"
    )
