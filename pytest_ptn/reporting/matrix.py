"""The rule x backend matrix built from results: cells, rows, level sections and the tests they report."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from pytest_ptn.reporting.results import (
    FAIL,
    NOT_APPLICABLE,
    NOT_EXERCISED,
    OUTCOME_LETTERS,
    OUTCOME_WORDS,
    PASS,
    SKIP,
    UNKNOWN_RULE,
    UNKNOWN_RULE_TITLE,
    XFAIL,
    XPASS,
    Result,
    Results,
    backend_sort_key,
    level_sort_key,
    rule_sort_key,
    sort_results,
)
from pytest_ptn.ruleset import LEVELS, RULES

INTERMITTENT_LETTER = "i"
"""The count letter of the tests an expectation lists as intermittent, in a terminal cell."""

# --- the matrix -------------------------------------------------------------------------------------


def intermittent_did(outcomes: Counter[str]) -> str:
    """What intermittent tests did this time: ``1 passed, 2 failed``."""
    counts = (("passed", outcomes[PASS]), ("failed", outcomes[XFAIL]))
    return ", ".join(f"{n} {word}" for word, n in counts if n)


@dataclass
class Cell:
    """All results of one rule on one backend."""

    results: list[Result] = field(default_factory=list)

    @property
    def counts(self) -> Counter[str]:
        """Outcomes of the results not listed as intermittent (those are counted apart)."""
        return Counter(r.outcome for r in self.results if not r.intermittent)

    @property
    def intermittent(self) -> Counter[str]:
        """What the tests an expectation lists as intermittent did this time: pass or xfail."""
        return Counter(r.outcome for r in self.results if r.intermittent)

    @property
    def status(self) -> str:
        counts = self.counts
        if counts[FAIL] or counts[XPASS]:
            return FAIL
        if counts[XFAIL] or self.intermittent:  # a known bug, whether it showed this time or not
            return XFAIL
        for outcome in (PASS, NOT_EXERCISED, NOT_APPLICABLE):
            if counts[outcome]:
                return outcome
        return SKIP

    @property
    def label(self) -> str:
        counts, intermittent = self.counts, self.intermittent
        letters = [f"{counts[o]}{letter}" for o, letter in OUTCOME_LETTERS.items() if counts[o]]
        if intermittent:
            letters.append(f"{intermittent.total()}{INTERMITTENT_LETTER}")
        return " ".join(letters)

    @property
    def words(self) -> str:
        """The counts spelled out, for renderings that have room: `1 fail · 7 pass · 2 intermittent (1
        passed, 1 failed)`."""
        counts = self.counts
        words = [f"{counts[o]} {word}" for o, word in OUTCOME_WORDS.items() if counts[o]]
        if self.intermittent:
            words.append(f"{self.intermittent.total()} intermittent ({intermittent_did(self.intermittent)})")
        return " · ".join(words)

    @property
    def notable(self) -> list[Result]:
        """The results a reader wants to open: everything but passes and not-applicable (an intermittent
        test's pass included: it is what a timing-dependent verdict did this time)."""
        return [r for r in self.results if r.intermittent or r.outcome not in (PASS, NOT_APPLICABLE)]


@dataclass
class Row:
    rule: str
    title: str
    level: str
    cells: dict[str, Cell]


@dataclass
class Matrix:
    backends: list[str]
    rows: list[Row]

    def sections(self) -> list[tuple[str, list[Row]]]:
        """MUST rows, then SHOULD rows, then any other level; empty sections left out."""
        levels = sorted({r.level for r in self.rows} | set(LEVELS), key=level_sort_key)
        grouped = [(level, [r for r in self.rows if r.level == level]) for level in levels]
        return [(level, rows) for level, rows in grouped if rows]

    def failing(self, level: str) -> list[tuple[str, str]]:
        return [
            (row.rule, b)
            for row in self.rows
            if row.level == level
            for b, c in row.cells.items()
            if c.status == FAIL
        ]


def build_matrix(results: Iterable[Result]) -> Matrix:
    """Rules with at least one result as rows (spec order), backends as columns."""
    rows: dict[str, Row] = {}
    for r in sort_results(results):
        rule = RULES.get(r.rule)
        title = rule.title if rule else UNKNOWN_RULE_TITLE if r.rule == UNKNOWN_RULE else ""
        row = rows.setdefault(r.rule, Row(r.rule, title, r.level, {}))
        row.cells.setdefault(r.backend, Cell()).results.append(r)
    backends = sorted({b for row in rows.values() for b in row.cells}, key=backend_sort_key)
    return Matrix(backends, list(rows.values()))


@dataclass
class ReportedTest:
    """One test's result as a report lists it: a test checking several rules yields one Result per rule and
    one ReportedTest. Not a check's finding (pytest_ptn.check.findings)."""

    rules: list[str]
    result: Result

    @property
    def title(self) -> str:
        r = self.result
        scenario = f" · {r.scenario}" if r.scenario else ""
        seed = f" (seed {r.seed})" if r.seed is not None else ""
        return f"{', '.join(self.rules)} on {r.backend}{scenario}{seed}"


def reported_tests(
    results: Iterable[Result], outcomes: tuple[str, ...], intermittent: bool = False
) -> list[ReportedTest]:
    """The results with these outcomes, one per test and backend, in canonical order: of the tests listed
    as intermittent with ``intermittent``, else of the others."""
    grouped: dict[tuple[str, str], ReportedTest] = {}
    for r in sort_results(results):
        if r.outcome in outcomes and r.intermittent == intermittent:
            grouped.setdefault((r.nodeid, r.backend), ReportedTest([], r)).rules.append(r.rule)
    return list(grouped.values())


def intermittent_tests(results: Iterable[Result]) -> list[ReportedTest]:
    """The tests listed as intermittent, each with what it did this time (its result's outcome)."""
    return reported_tests(results, (PASS, XFAIL), intermittent=True)


def intermittent_count(found: list[ReportedTest]) -> str:
    """``3 intermittent tests (1 passed, 2 failed this time)``."""
    did = intermittent_did(Counter(f.result.outcome for f in found))
    return f"{len(found)} intermittent test{'s' if len(found) != 1 else ''} ({did} this time)"


@dataclass(frozen=True)
class CellChange:
    rule: str
    backend: str
    before: str | None  # cell status, None when the cell did not exist
    after: str | None

    @property
    def kind(self) -> str:
        if self.after == FAIL:
            return "newly failing"
        if self.before == FAIL:
            return "fixed"
        if self.before is None:
            return "new"
        if self.after is None:
            return "removed"
        return "changed"


_CHANGE_ORDER = ("newly failing", "fixed", "changed", "new", "removed")


def diff(previous: Results, current: Results) -> list[CellChange]:
    """Cells whose status differs, newly failing first: that is what a reviewer must look at."""
    before = {
        (row.rule, b): c.status for row in build_matrix(previous.results).rows for b, c in row.cells.items()
    }
    after = {
        (row.rule, b): c.status for row in build_matrix(current.results).rows for b, c in row.cells.items()
    }
    changes = [
        CellChange(rule, backend, before.get((rule, backend)), after.get((rule, backend)))
        for rule, backend in before.keys() | after.keys()
        if before.get((rule, backend)) != after.get((rule, backend))
    ]
    return sorted(
        changes,
        key=lambda c: (_CHANGE_ORDER.index(c.kind), rule_sort_key(c.rule), backend_sort_key(c.backend)),
    )
