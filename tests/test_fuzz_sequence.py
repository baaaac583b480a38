"""Under ptn-ci the programs are one fixed sequence: program i is the same program however the run is split
over workers and machines, so a verdict never depends on -n (pytest_ptn.fuzzing.sequence)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
from hypothesis import given, settings

import pytest_ptn.strategies  # noqa: F401  registers the profiles
from pytest_ptn.fuzzing.run import FuzzRun, FuzzShare
from pytest_ptn.spec import ProgramSpec
from pytest_ptn.strategies import program_specs

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup  # hypothesis's own dependency there


def _collecting(seen: list[ProgramSpec]) -> Callable[[ProgramSpec], None]:
    def check(spec: ProgramSpec) -> None:
        seen.append(spec)

    return check


def _judged(count: int) -> list[list[ProgramSpec]]:
    """The programs each share of a ptn-ci run split ``count`` ways judges, in order."""
    profile = settings.get_profile("ptn-ci")
    shares = []
    for index in range(count):
        seen: list[ProgramSpec] = []
        run = FuzzRun(profile, run_seed=1234 + index, share=FuzzShare(index, count), listed={})
        run(given(program_specs())(_collecting(seen)))()
        assert len(seen) == run.budget
        shares.append(seen)
    return shares


def test_the_ci_programs_are_the_same_with_one_two_or_sixteen_shares() -> None:
    (alone,) = _judged(1)
    assert len(alone) == settings.get_profile("ptn-ci").max_examples == 12
    assert len({repr(p) for p in alone}) == 12  # twelve programs, not one drawn twelve times
    for count in (2, 16):
        shares = _judged(count)
        interleaved = [shares[i % count][i // count] for i in range(12)]
        assert interleaved == alone, f"split {count} ways, the run judges other programs"


def test_every_failure_of_the_sequence_is_raised_after_the_last_program() -> None:
    """A failing program does not stop its share: the programs after it are judged too, and two kinds of
    failure are both raised."""
    seen: list[ProgramSpec] = []

    @given(program_specs())
    def check(spec: ProgramSpec) -> None:
        seen.append(spec)
        if len(seen) in (2, 5):
            raise (KeyError if len(seen) == 2 else ValueError)(len(seen))

    with pytest.raises(BaseExceptionGroup) as raised:
        FuzzRun(settings.get_profile("ptn-ci"), 0, FuzzShare(0, 1), {})(check)()
    assert len(seen) == 12
    assert sorted(type(e).__name__ for e in raised.value.exceptions) == ["KeyError", "ValueError"]
