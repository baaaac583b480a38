"""What a failed test carries to the reports: how its failure came about (pytest_ptn.mechanisms) and
whose it is (backend.Whose). ``carried`` is the one writer of both test properties: the plugin's report hook
writes what a case's checks found, or what a test that judges on its own (the fuzz) left on its item
(``FOUND``), and the controller what a crashed worker's death showed."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pytest

from pytest_ptn import mechanisms
from pytest_ptn.backend import WHOSE_PROPERTY, Whose


@dataclass(frozen=True)
class Found:
    """A failure's mechanisms, each once in the order found, and whose it is (None: no witness said)."""

    mechanisms: tuple[mechanisms.Mechanism, ...]
    whose: Whose | None = None


FOUND = pytest.StashKey[Found]()
"""What a test that judges on its own found, for the report hook to carry."""


def raised_by_backend(error: BaseException) -> bool:
    """Whether ``error`` is an exception no check made (a load or a call that raised), not a test's outcome
    (pytest's fail, skip, xfail) nor an ``assert`` of the test, whose words are a check's finding."""
    outcomes = (pytest.fail.Exception, pytest.skip.Exception, pytest.xfail.Exception, AssertionError)
    return isinstance(error, Exception) and not isinstance(error, outcomes)


def carried(properties: Iterable[tuple[str, object]], found: Found) -> list[tuple[str, object]]:
    """``properties`` with ``found``'s mechanisms (mechanisms.PROPERTY) and whose (WHOSE_PROPERTY), each
    where it says something and the test carries none yet."""
    out = list(properties)
    names = {name for name, _ in out}
    if found.mechanisms and mechanisms.PROPERTY not in names:
        out.append((mechanisms.PROPERTY, mechanisms.to_json(found.mechanisms)))
    if found.whose is not None and WHOSE_PROPERTY not in names:
        out.append((WHOSE_PROPERTY, found.whose.value))
    return out
