"""Failures grouped by cause: one bug that fails forty tests is one line to read first, not forty.

A failed test carries the mechanisms its checks found (pytest_ptn.mechanisms: a method that read another
method's tensor of the same name, state that starts zero-filled, two keys with other bytes in one
allocation, a crash at a step, a lowering error, an exception), and whose it is (backend.Whose), as data;
tests that show the same mechanism form one cause, and one defect of executorch's lowering shown through
several backends is one cause naming each. A test with only a symptom (a wrong value nothing explains, a
check of the test's own) joins the cause proven in its own (backend, scenario) when exactly one is;
otherwise tests with the same symptom form a cause of their own. No failure text is read for meaning.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pytest_ptn.backend import LOWERING_FAULT, RUNTIME_FAULT, Whose
from pytest_ptn.mechanisms import TRAITS, Kind, Mechanism, without_names
from pytest_ptn.reporting.matrix import ReportedTest, reported_tests
from pytest_ptn.reporting.reasons import headline, strip_noise
from pytest_ptn.reporting.results import FAIL, XPASS, Result, rule_sort_key
from pytest_ptn.ruleset import STRICT_XPASS_PREFIX

BY_NAME = TRAITS[Kind.BY_NAME].cause
LOOKALIKE = TRAITS[Kind.LOOKALIKE].cause
PRIVATE_STATE = TRAITS[Kind.PRIVATE_COPY].cause
ZERO_FILLED = TRAITS[Kind.ZERO_FILLED].cause
REINITIALISED = TRAITS[Kind.REINITIALISED].cause
ONE_MEMORY = TRAITS[Kind.ONE_MEMORY].cause
MISINITIALISED = TRAITS[Kind.MISINITIALISED].cause
SHARED_ARENA = TRAITS[Kind.SHARED_ARENA].cause
WRITE_RETURNED = TRAITS[Kind.WRITE_RETURNED].cause
SHARES_DIFFERING = TRAITS[Kind.SHARES_DIFFERING].cause
NOT_SHARED = TRAITS[Kind.NOT_SHARED].cause
MEMORY = TRAITS[Kind.MEMORY_PENALTY].cause
CROSS_PROGRAM = TRAITS[Kind.CROSS_PROGRAM].cause
CRASH = TRAITS[Kind.CRASH].cause
HANG = TRAITS[Kind.HANG].cause
LOWERING = TRAITS[Kind.LOWERING].cause
ERROR = TRAITS[Kind.ERROR].cause
STALE = "stale expectation"
SYMPTOM = "symptom"
"""The kinds of cause, each mechanism kind's as pytest_ptn.mechanisms.TRAITS names it; every kind but
SYMPTOM is evidence of a defect, SYMPTOM only shows one."""


@dataclass(frozen=True)
class Evidence:
    """What one failing test shows: the kind of defect, what identifies it, and the line that says so."""

    kind: str
    key: tuple[str, ...]
    summary: str

    @property
    def proves(self) -> bool:
        return self.kind != SYMPTOM


@dataclass
class Cause:
    """Failing tests of one backend that one defect explains."""

    number: int
    evidence: Evidence
    backend: str
    found: list[ReportedTest] = field(default_factory=list)
    joined: int = 0
    """How many of ``found`` showed only a symptom and were joined to this cause by their case."""

    @property
    def summary(self) -> str:
        return self.evidence.summary

    @property
    def example(self) -> ReportedTest:
        """The first test (canonical order) that shows the evidence itself, not only a symptom."""
        own = [f for f in self.found if evidence_of(f.result).key == self.evidence.key]
        return (own or self.found)[0]

    @property
    def rules(self) -> Counter[str]:
        counts = Counter(rule for f in self.found for rule in f.rules)
        return Counter(dict(sorted(counts.items(), key=lambda item: rule_sort_key(item[0]))))

    @property
    def scenarios(self) -> list[str]:
        return sorted({f.result.scenario for f in self.found if f.result.scenario})

    @property
    def tests(self) -> list[str]:
        return [f.result.nodeid for f in self.found]

    def explains(self) -> str:
        """`47 tests (E1 x11, S2 x11, ...) on 11 scenarios`: what a reader weighs the cause by."""
        rules = ", ".join(f"{rule} x{n}" for rule, n in self.rules.items())
        scenarios = self.scenarios
        on = f" on {len(scenarios)} scenario{'s' * (len(scenarios) != 1)}" if scenarios else ""
        test_word = "test" if len(self.found) == 1 else "tests"
        return f"{len(self.found)} {test_word} ({rules}){on}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "kind": self.evidence.kind,
            "backend": self.backend,
            "summary": self.summary,
            "rules": dict(self.rules),
            "scenarios": self.scenarios,
            "tests": self.tests,
            "joined_by_case": self.joined,
            "example": self.example.result.nodeid,
            "reproduce": self.example.result.repro,
        }


def evidence_of(result: Result) -> Evidence:
    """What a failing result shows about its cause: the first mechanism it carries that accounts for
    something, else the first wrong value nothing explains (where it is), else its first line."""
    if result.outcome == XPASS or result.reason.startswith(STRICT_XPASS_PREFIX):
        return Evidence(STALE, (STALE,), "known failures now pass: remove their stale expectation entries")
    shown = next((m for m in result.mechanisms if m.kind in TRAITS), None)
    if shown is not None:
        return _of_mechanism(shown)
    unexplained = next((m for m in result.mechanisms if m.kind == Kind.UNEXPLAINED and m.detail), None)
    if unexplained is not None:  # one wrong value, seen by several tests (schedules, E1 and E3): one cause
        summary = f"a wrong value nothing explains at {unexplained.detail}"
        return Evidence(SYMPTOM, (SYMPTOM, result.scenario or "", unexplained.detail), summary)
    lines = [strip_noise(line.strip()) for line in result.reason.splitlines() if line.strip()]
    said = (lines[0] if lines else "").removesuffix(":") or "fails"
    return Evidence(SYMPTOM, (SYMPTOM, without_names(said)), said)


def _of_mechanism(m: Mechanism) -> Evidence:
    """A mechanism's cause: one per key (a by-name read of any sort of tensor is the loader's one defect,
    as the storage rules' by-name finding is), in its words."""
    traits = TRAITS[m.kind]
    key = (BY_NAME,) if m.kind == Kind.BY_NAME else (traits.cause, m.key)
    return Evidence(traits.cause, key, headline(traits.words.format(of=m.of, detail=m.detail or m.key)))


def whose(result: Result, evidence: Evidence) -> Evidence:
    """``evidence``, for a backend with a witness (a runtime of .pte files), saying whose the defect is: one
    mechanism the runtime shows and executorch.runtime does not is another cause than the lowering's."""
    if result.whose == Whose.RUNTIME:
        return Evidence(evidence.kind, (*evidence.key, RUNTIME_FAULT), f"{RUNTIME_FAULT}: {evidence.summary}")
    if result.whose == Whose.LOWERING:
        said = f"{LOWERING_FAULT} (executorch.runtime does the same): {evidence.summary}"
        return Evidence(evidence.kind, (*evidence.key, LOWERING_FAULT), said)
    return evidence


def find_causes(results: Iterable[Result]) -> list[Cause]:
    """The causes of every failed test (fail or xpass), a runtime's own first, then largest first, numbered
    from 1."""
    failing = reported_tests(results, (FAIL, XPASS))
    shown = [(f, whose(f.result, evidence_of(f.result))) for f in failing]
    across_names = {f.result.backend: ev for f, ev in shown if ev.kind == SHARES_DIFFERING}
    # A loader that shares differing constants across names shows by-name reads too where names collide:
    # one defect, the wider one.
    shown = [(f, across_names.get(f.result.backend, ev) if ev.kind == BY_NAME else ev) for f, ev in shown]
    proven: dict[tuple[str, str | None], set[tuple[str, ...]]] = {}
    for f, ev in shown:
        if ev.proves:
            proven.setdefault((f.result.backend, f.result.scenario), set()).add(ev.key)
    first_evidence: dict[tuple[str, tuple[str, ...]], Evidence] = {}
    for f, ev in shown:
        first_evidence.setdefault((_whose_backends(f, ev.key), ev.key), ev)
    groups: dict[tuple[str, tuple[str, ...]], Cause] = {}
    for f, ev in shown:
        key, joined = ev.key, False
        if not ev.proves:
            in_case = proven.get((f.result.backend, f.result.scenario), set())
            if len(in_case) == 1:
                key, joined = next(iter(in_case)), True
        ev = first_evidence[(_whose_backends(f, key), key)]
        cause = groups.setdefault((_whose_backends(f, ev.key), ev.key), Cause(0, ev, f.result.backend))
        cause.found.append(f)
        cause.joined += joined
    for cause in groups.values():  # one defect of the lowering, shown through several backends: each named
        cause.backend = ", ".join(dict.fromkeys(f.result.backend for f in cause.found))
    ordered = sorted(
        groups.values(),
        key=lambda c: (
            RUNTIME_FAULT not in c.evidence.key,
            -len(c.found),
            rule_sort_key(next(iter(c.rules))),
        ),
    )
    for number, cause in enumerate(ordered, 1):
        cause.number = number
    return ordered


def _whose_backends(f: ReportedTest, key: tuple[str, ...]) -> str:
    """The backends one cause of evidence ``key`` spans: a defect executorch.runtime shows too is the
    lowering's or upstream's, one cause whichever backends run that lowering; any other is its backend's."""
    return "" if LOWERING_FAULT in key else f.result.backend


def cause_of(causes: list[Cause]) -> dict[tuple[str, str], int]:
    """(nodeid, backend) -> the number of the cause that explains that failing test."""
    return {(f.result.nodeid, f.result.backend): c.number for c in causes for f in c.found}
