"""A test that cannot apply to a backend or scenario ends as "not applicable", not as a plain skip. The type
of its skip's reason says so, and the plugin carries that to the reports as a property of the test
(OUTCOME_PROPERTY): the reports never read an outcome back from a reason's words."""

from __future__ import annotations

from typing import NoReturn

import pytest

from pytest_ptn.ruleset import not_applicable

OUTCOME_PROPERTY = "ptn_outcome"
"""The test property (``report.user_properties``) naming an outcome pytest's own do not tell apart (a
``reporting.results`` outcome): not applicable (a skip), or a SHOULD rule not met (an xfail to pytest)."""


class NotApplicableReason(str):
    """The reason of a skip that ends a test which cannot apply: pytest shows it as any skip's."""

    __slots__ = ()


def skip_not_applicable(reason: str) -> NoReturn:
    """Skip the calling test as not applicable: ``reason`` says why, for people. The skip is reported at
    the caller's line, as ``pytest.skip``'s is."""
    __tracebackhide__ = True
    pytest.skip(NotApplicableReason(not_applicable(reason)))


def is_not_applicable(error: BaseException) -> bool:
    """Whether ``error`` is the skip ``skip_not_applicable`` raised."""
    return isinstance(error, pytest.skip.Exception) and isinstance(error.msg, NotApplicableReason)
