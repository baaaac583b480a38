"""The results.json schema as plain data: outcomes, rows, loading, saving, merging and diffing.

Kept free of pytest (and of torch) so that CI can merge and compare result files from several machines
with nothing but Python.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_ptn.ruleset import LEVELS, RULES

SCHEMA = "pytest-ptn/results"
SCHEMA_VERSION = 1

PASS = "pass"
XFAIL = "xfail"
FAIL = "fail"
XPASS = "xpass"
NOT_APPLICABLE = "not_applicable"
SKIP = "skip"
OUTCOMES = (PASS, XFAIL, FAIL, XPASS, NOT_APPLICABLE, SKIP)

# Count letters for the terminal; pytest's own letters where it has one, so the table reads like `-rA`.
# Ordered so the worrying counts come first in a cell.
OUTCOME_LETTERS = {FAIL: "F", XPASS: "X", XFAIL: "x", PASS: "p", NOT_APPLICABLE: "-", SKIP: "s"}
OUTCOME_WORDS = {
    FAIL: "fail",
    XPASS: "xpass",
    XFAIL: "xfail",
    PASS: "pass",
    NOT_APPLICABLE: "n/a",
    SKIP: "skip",
}

UNKNOWN_RULE = "?"
"""The rule of a test that failed without ptn properties (a crash or internal error report): counted as a MUST
failure so that no failed test is left out of the matrix."""
UNKNOWN_RULE_TITLE = "rules unknown: a test failed"

MAX_REASON_LINES = 40
MAX_REASON_CHARS = 4000


class ResultsFormatError(ValueError):
    """A results file that is not a pytest-ptn results document this version can read."""


@dataclass(frozen=True)
class Result:
    """One (test, rule) outcome: a test that checks several rules yields one Result per rule."""

    rule: str
    level: str
    scenario: str | None
    backend: str
    outcome: str
    reason: str
    repro: str
    seed: int | None
    nodeid: str
    schedule: str | None = None
    """The load schedule the test ran under (pytest_ptn.schedule), for the E tests; None elsewhere."""


@dataclass
class Results:
    """A results document. `sources` lists the provenance of each run a merged document came from."""

    spec_version: str
    provenance: dict[str, str]
    results: list[Result]
    sources: list[dict[str, str]] = field(default_factory=list)


def rule_sort_key(rule: str) -> tuple[int, str]:
    """Spec order (P1..P10, E.., S.., X..) for known rules; unknown ids after, alphabetically."""
    order = list(RULES)
    return (order.index(rule), "") if rule in RULES else (len(order), rule)


def backend_sort_key(backend: str) -> tuple[bool, str]:
    """`reference` first: it is the baseline every other column is read against."""
    return (backend != "reference", backend)


def level_sort_key(level: str) -> tuple[int, str]:
    return (LEVELS.index(level), "") if level in LEVELS else (len(LEVELS), level)


def sort_results(results: Iterable[Result]) -> list[Result]:
    """A canonical order (MUST before SHOULD, then spec order), so runs that differ only in scheduling
    (xdist) give identical files and failure lists start with what fails the run."""
    return sorted(
        results,
        key=lambda r: (level_sort_key(r.level), rule_sort_key(r.rule), backend_sort_key(r.backend), r.nodeid),
    )


# --- results.json -----------------------------------------------------------------------------------


def to_dict(doc: Results) -> dict[str, Any]:
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "spec_version": doc.spec_version,
        "provenance": dict(doc.provenance),
        "results": [asdict(r) for r in sort_results(doc.results)],
    }
    if doc.sources:
        data["sources"] = [dict(s) for s in doc.sources]
    return data


def from_dict(data: Any) -> Results:
    """Validate as we read: a report built from a half-understood file would silently misstate results."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ResultsFormatError(f"not a {SCHEMA} document")
    if data.get("version") != SCHEMA_VERSION:
        raise ResultsFormatError(
            f"{SCHEMA} version {data.get('version')!r} is not supported "
            f"(this pytest-ptn reads version {SCHEMA_VERSION})"
        )
    if not isinstance(data.get("results"), list):
        raise ResultsFormatError(f"malformed {SCHEMA} document: results must be a list")
    try:
        results = [_result(i, row) for i, row in enumerate(data["results"])]
        doc = Results(
            spec_version=str(data["spec_version"]),
            provenance={str(k): str(v) for k, v in data["provenance"].items()},
            results=results,
            sources=[{str(k): str(v) for k, v in s.items()} for s in data.get("sources", [])],
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ResultsFormatError(f"malformed {SCHEMA} document: {exc}") from exc
    return doc


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "rule": (str,),
    "level": (str,),
    "scenario": (str, type(None)),
    "backend": (str,),
    "outcome": (str,),
    "reason": (str,),
    "repro": (str,),
    "seed": (int, type(None)),
    "nodeid": (str,),
    "schedule": (str, type(None)),
}
OPTIONAL_FIELDS = {"schedule": None}
"""Fields a row written before they existed may lack, with the value that means."""


def _result(index: int, row: Any) -> Result:
    """One results row, every field of the type the renderings and merge rely on."""
    where = f"result #{index}"
    if not isinstance(row, dict):
        raise ResultsFormatError(f"{where} is not an object: {reprlib.repr(row)}")
    where += f" ({reprlib.repr(row.get('nodeid'))})"
    row = {**OPTIONAL_FIELDS, **row}
    if set(row) != set(_FIELD_TYPES):
        fields = ", ".join(sorted(set(row) ^ set(_FIELD_TYPES)))
        raise ResultsFormatError(f"{where}: missing or unknown fields: {fields}")
    for name, types in _FIELD_TYPES.items():
        value = row[name]
        if not isinstance(value, types) or isinstance(value, bool):
            kind = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise ResultsFormatError(f"{where}: {name} must be {kind}, not {reprlib.repr(value)}")
    if row["level"] not in LEVELS:
        raise ResultsFormatError(f"{where}: level must be one of {', '.join(LEVELS)}, not {row['level']!r}")
    if row["outcome"] not in OUTCOMES:
        raise ResultsFormatError(f"{where}: unknown outcome {reprlib.repr(row['outcome'])}")
    return Result(**row)


def load(path: Path) -> Results:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ResultsFormatError(f"{path}: not UTF-8 text: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ResultsFormatError(f"{path}: not JSON: {exc}") from exc
    except RecursionError as exc:
        raise ResultsFormatError(f"{path}: JSON nested too deeply to read") from exc
    try:
        return from_dict(data)
    except ResultsFormatError as exc:
        raise ResultsFormatError(f"{path}: {exc}") from exc


def save(doc: Results, path: Path, derived: dict[str, Any] | None = None) -> None:
    """``derived``: what the renderings computed from the results (the causes), written beside them for
    machines; reading a file ignores it, since it follows from the results."""
    data = {**to_dict(doc), **(derived or {})}
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# --- merge and diff -----------------------------------------------------------------------------------


def merge(docs: Sequence[Results]) -> Results:
    """Combine runs (typically one per backend or machine) into one matrix.

    A (nodeid, rule, backend) present in several inputs keeps the later input's row, so re-running one
    backend and merging it last replaces its stale results.
    """
    if not docs:
        raise ValueError("nothing to merge")
    spec_versions = {d.spec_version for d in docs}
    if len(spec_versions) > 1:
        raise ResultsFormatError(f"cannot merge results of different spec versions: {sorted(spec_versions)}")
    rows: dict[tuple[str, str, str], Result] = {}
    sources: list[dict[str, str]] = []
    for doc in docs:
        for r in doc.results:
            rows[(r.nodeid, r.rule, r.backend)] = r
        if doc.sources:
            sources.extend(doc.sources)
        else:
            backends = sorted({r.backend for r in doc.results}, key=backend_sort_key)
            sources.append({**doc.provenance, "backends": ", ".join(backends)})
    common = dict(sources[0])
    for source in sources[1:]:
        common = {k: v for k, v in common.items() if source.get(k) == v}
    return Results(spec_versions.pop(), common, sort_results(rows.values()), sources)


def one_line(text: str, limit: int = 300) -> str:
    """The first non-empty line, whitespace collapsed and capped, so a reason fits in a table cell."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = " ".join(line.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def whole_reason(text: str, max_lines: int = MAX_REASON_LINES, max_chars: int = MAX_REASON_CHARS) -> str:
    """The whole failure message (every mismatch line is the finding), capped so that one runaway message
    cannot swamp a report: at most ``max_lines`` lines and about ``max_chars`` characters."""
    lines = [ln.rstrip() for ln in text.strip("\n").splitlines()]
    kept: list[str] = []
    size = 0
    for line in lines:
        if len(kept) == max_lines or size + len(line) > max_chars:
            break
        kept.append(line)
        size += len(line) + 1
    if not kept and lines:  # one line longer than the whole budget
        kept = [lines[0][: max_chars - 3] + "..."]
    dropped = len(lines) - len(kept)
    if dropped:
        kept.append(f"... {dropped} more line{'s' if dropped > 1 else ''}")
    return "\n".join(kept)
