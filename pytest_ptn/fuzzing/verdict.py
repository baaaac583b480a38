"""The fuzz test's judgement of one drawn program: what it showed, mechanism by mechanism, so that a
program a listed mechanism explains is counted and passed over, and one with anything unlisted fails.

Each unlisted mechanism fails with an exception class of its own (``unlisted``): hypothesis tells failures
apart by their origin, so two unlisted mechanisms are two failures, each shrunk, and shrinking one never
slips into a program that shows a listed mechanism (that program passes) or another unlisted one (that is
the other failure).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_ptn.mechanisms import Kind, Mechanism, Step, raised

if TYPE_CHECKING:
    from pytest_ptn.backend import Backend, Whose
    from pytest_ptn.check.earlier import EarlierPrograms
    from pytest_ptn.harness import Case
    from pytest_ptn.spec import ProgramSpec

SHOWN_MISMATCHES = 10


@dataclass(frozen=True)
class Verdict:
    """A drawn program on a backend: the mechanisms its failure shows (none: it passed) and its text."""

    mechanisms: tuple[Mechanism, ...]
    message: str
    whose: frozenset[Whose] = frozenset()
    """Whose the failure is, where the backend has a witness (a runtime of .pte files)."""
    held: tuple[int, int] | None = None
    """(constants the backend under test held, constants in all) of the lowered program, where the backend
    says (``Lowered.ownership``); None: unknown, or nothing lowered."""

    @property
    def keys(self) -> list[str]:
        """Each mechanism's key once, a wrong value nothing explains first."""
        keys = dict.fromkeys(m.key for m in self.mechanisms)
        return sorted(keys, key=lambda k: (k != Kind.UNEXPLAINED.value, k))

    def unlisted(self, listed: set[str]) -> list[str]:
        return [k for k in self.keys if k not in listed]


def verdict_on(
    backend: Backend,
    spec: ProgramSpec,
    workdir: Path,
    entering: Callable[[Step], None] = lambda step: None,
    earlier: EarlierPrograms | None = None,
) -> Verdict:
    """Lower, load and run ``spec`` on ``backend`` under every load schedule, as ``check_spec`` does; an
    exception at a step is that step's mechanism, a wrong value the mechanisms the checks found for it.
    ``entering`` is told each step as it starts (where a crash or a hang would be). ``earlier``: what the
    programs judged before in this process held, which a cache that outlives its program hands this one,
    and what they showed, which breaks a tie between kinds one program cannot tell apart; this program
    joins it once the backend has loaded it."""
    from pytest_ptn.harness import Case, spec_mismatches
    from pytest_ptn.spec import Scenario

    case = Case(backend, Scenario("spec", "", spec), lambda name: workdir, earlier=earlier)
    names = [m.name for m in spec.methods]  # a generated name never goes into a key
    entering(Step.LOWERING)
    lowered = case.lowered()
    if isinstance(lowered, Exception):
        return Verdict(
            (raised(Step.LOWERING, lowered, names),), f"lowering failed: {type(lowered).__name__}: {lowered}"
        )
    if earlier is not None:
        earlier.add(case.program.export)
    ownership = lowered.ownership()
    held = None if ownership is None else ownership.counts()
    entering(Step.RUNNING)
    try:
        mismatches = spec_mismatches(case)
    except Exception as e:  # the backend raised while loading or running
        verdict = _raised_running(case, e, names)
        if earlier is not None:
            earlier.showed(verdict.mechanisms)
        return dataclasses.replace(verdict, held=held)
    if earlier is not None:
        earlier.showed(m for mismatch in mismatches for m in mismatch.mechanisms)
    if not mismatches:
        return Verdict((), "", held=held)
    lines = [f"  {m}" for m in mismatches[:SHOWN_MISMATCHES]]
    if len(mismatches) > SHOWN_MISMATCHES:
        lines.append(f"  ... and {len(mismatches) - SHOWN_MISMATCHES} more")
    how = tuple(m for mismatch in mismatches for m in mismatch.mechanisms)
    return Verdict(how, "outputs differ from eager:\n" + "\n".join(lines), frozenset(case.whose), held)


def _raised_running(case: Case, error: Exception, names: list[str]) -> Verdict:
    """An error while loading or running: the faulty binding that makes the program raise the same is its
    mechanism (a loader binding another method's tensor of another dtype fails the method's graph as the
    replay binding it does); an error none reproduces is its step, type and message."""
    said = f"{type(error).__name__}: {error}"
    error_of = raised(Step.RUNNING, error, names)
    replay = case.replays.raising(error, case.eager(), case.raised_at, names)
    whose, of = _whose_error(case)
    if whose:
        said += f"\n  {whose}"
    if replay is None:
        detail = f"{error_of.detail}; {whose}" if whose else error_of.detail
        return Verdict((dataclasses.replace(error_of, detail=detail),), said, of)
    return Verdict(replay.mechanisms, f"{said}\n  it is {replay.label}", of)


def _whose_error(case: Case) -> tuple[str, frozenset[Whose]]:
    """Whose an error is, in words and as data, for a backend with a witness (a runtime of .pte files:
    executorch.runtime on the same .pte): the witness raising too makes it the lowering's or upstream's,
    the witness running every call the backend's own. Nothing for a backend without one."""
    from pytest_ptn.backend import LOWERING_FAULT, RUNTIME_FAULT, Whose, one_line
    from pytest_ptn.schedule import LoadSchedule

    lowered = case.lowered()
    witnesses = (
        [] if isinstance(lowered, Exception) else [case.backend.witness(lowered) for _ in LoadSchedule]
    )
    by = ""
    for witness, schedule in zip(witnesses, LoadSchedule, strict=True):  # a fresh load for each schedule
        if witness is None:
            return "", frozenset()
        by = witness.by
        try:
            case.run_calls(witness.loaded, case.eager(), schedule)
        except Exception as e:
            return f"{by} raises {one_line(e)} too: {LOWERING_FAULT}", frozenset({Whose.LOWERING})
    return (f"{by} runs every call: {RUNTIME_FAULT}", frozenset({Whose.RUNTIME})) if by else ("", frozenset())


class UnlistedMechanism(Exception):
    """A drawn program showed a mechanism the backend's expectations do not list."""


_CLASSES: dict[str, type[UnlistedMechanism]] = {}


def unlisted(key: str) -> type[UnlistedMechanism]:
    """The exception class of mechanism ``key``: one class per key, so hypothesis keeps them apart."""
    if key not in _CLASSES:
        name = "Unlisted_" + "".join(c if c.isalnum() else "_" for c in key)
        _CLASSES[key] = type(name, (UnlistedMechanism,), {"key": key})
    return _CLASSES[key]


def program_size(spec: ProgramSpec) -> tuple[int, int, int]:
    """How big a program is, for the tally's smallest: methods, calls, constants."""
    return len(spec.methods), len(spec.calls), len(spec.shared) + sum(len(m.constants) for m in spec.methods)
