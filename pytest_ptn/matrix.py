"""Conformance results as plain data: the results.json schema, merging, diffing and the three renderings.

Kept free of pytest (and of torch) so that CI can merge and compare result files from several machines
with nothing but Python, and so that one model feeds the terminal, Markdown and HTML views alike.
"""

from __future__ import annotations

import html
import json
import re
import reprlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_ptn.ruleset import RULES

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
_LETTERS = {FAIL: "F", XPASS: "X", XFAIL: "x", PASS: "p", NOT_APPLICABLE: "-", SKIP: "s"}
LEGEND = "legend: F fail  X xpass (a fail)  x xfail (known bug)  p pass  - n/a  s skip  . not run"
_WORDS = {FAIL: "fail", XPASS: "xpass", XFAIL: "xfail", PASS: "pass", NOT_APPLICABLE: "n/a", SKIP: "skip"}
_LEVELS = ("MUST", "SHOULD")

UNKNOWN_RULE = "?"
"""The rule of a test that failed without ptn properties (a crash or internal error report): counted as a MUST
failure so that no failed test is left out of the matrix."""
UNKNOWN_RULE_TITLE = "rules unknown: a test failed"

NOTHING_RAN = "not applicable"
"""The verdict of a level none of whose tests ran (every cell n/a or skipped)."""

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
    return (_LEVELS.index(level), "") if level in _LEVELS else (len(_LEVELS), level)


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
}


def _result(index: int, row: Any) -> Result:
    """One results row, every field of the type the renderings and merge rely on."""
    where = f"result #{index}"
    if not isinstance(row, dict):
        raise ResultsFormatError(f"{where} is not an object: {reprlib.repr(row)}")
    where += f" ({reprlib.repr(row.get('nodeid'))})"
    if set(row) != set(_FIELD_TYPES):
        fields = ", ".join(sorted(set(row) ^ set(_FIELD_TYPES)))
        raise ResultsFormatError(f"{where}: missing or unknown fields: {fields}")
    for name, types in _FIELD_TYPES.items():
        value = row[name]
        if not isinstance(value, types) or isinstance(value, bool):
            kind = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise ResultsFormatError(f"{where}: {name} must be {kind}, not {reprlib.repr(value)}")
    if row["level"] not in _LEVELS:
        raise ResultsFormatError(f"{where}: level must be one of {', '.join(_LEVELS)}, not {row['level']!r}")
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


def save(doc: Results, path: Path) -> None:
    path.write_text(json.dumps(to_dict(doc), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_reports(doc: Results, outdir: Path, changes: Sequence[CellChange] | None = None) -> list[Path]:
    """Write results.json, summary.md and index.html into `outdir`; return their paths."""
    outdir.mkdir(parents=True, exist_ok=True)
    json_path, md_path, html_path = outdir / "results.json", outdir / "summary.md", outdir / "index.html"
    save(doc, json_path)
    md_path.write_text(render_markdown(doc, changes), encoding="utf-8")
    html_path.write_text(render_html(doc, changes), encoding="utf-8")
    return [json_path, md_path, html_path]


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


# --- the matrix -------------------------------------------------------------------------------------


@dataclass
class Cell:
    """All results of one rule on one backend."""

    results: list[Result] = field(default_factory=list)

    @property
    def counts(self) -> Counter[str]:
        return Counter(r.outcome for r in self.results)

    @property
    def status(self) -> str:
        counts = self.counts
        if counts[FAIL] or counts[XPASS]:
            return FAIL
        for outcome in (XFAIL, PASS, NOT_APPLICABLE):
            if counts[outcome]:
                return outcome
        return SKIP

    @property
    def label(self) -> str:
        counts = self.counts
        return " ".join(f"{counts[o]}{letter}" for o, letter in _LETTERS.items() if counts[o])

    @property
    def words(self) -> str:
        """The counts spelled out, for renderings that have room: `1 fail · 7 pass`."""
        counts = self.counts
        return " · ".join(f"{counts[o]} {word}" for o, word in _WORDS.items() if counts[o])

    @property
    def notable(self) -> list[Result]:
        """The results a reader wants to open: everything but passes and not-applicable."""
        return [r for r in self.results if r.outcome not in (PASS, NOT_APPLICABLE)]


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
        levels = sorted({r.level for r in self.rows} | set(_LEVELS), key=level_sort_key)
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


@dataclass
class Finding:
    """One failing test's result (a test checking several rules yields one Result per rule, one Finding)."""

    rules: list[str]
    result: Result

    @property
    def title(self) -> str:
        r = self.result
        scenario = f" · {r.scenario}" if r.scenario else ""
        seed = f" (seed {r.seed})" if r.seed is not None else ""
        return f"{', '.join(self.rules)} on {r.backend}{scenario}{seed}"


def findings(results: Iterable[Result], outcomes: tuple[str, ...]) -> list[Finding]:
    """The results with these outcomes, one per test and backend, in canonical order."""
    grouped: dict[tuple[str, str], Finding] = {}
    for r in sort_results(results):
        if r.outcome in outcomes:
            grouped.setdefault((r.nodeid, r.backend), Finding([], r)).rules.append(r.rule)
    return list(grouped.values())


# --- text ---------------------------------------------------------------------------------------------

Paint = Callable[[str, str], str]
_NAME_WIDTH = 36


def _no_paint(text: str, status: str) -> str:
    return text


def render_text(doc: Results, paint: Paint = _no_paint) -> list[str]:
    """The terminal matrix. `paint(text, status)` may colour a cell's text (padding is added after)."""
    matrix = build_matrix(doc.results)
    if not matrix.rows:
        return ["no conformance results"]
    id_width = max(len(row.rule) for row in matrix.rows) + 1
    names = {row.rule: f"{row.rule.ljust(id_width)} {row.title}"[:_NAME_WIDTH] for row in matrix.rows}
    name_width = max(len(name) for name in names.values())
    widths = {
        b: max([len(b)] + [len(row.cells[b].label) for row in matrix.rows if b in row.cells])
        for b in matrix.backends
    }
    lines = [" " * (name_width + 4) + "  ".join(b.ljust(widths[b]) for b in matrix.backends).rstrip()]
    for level, rows in matrix.sections():
        lines.append(f"{level} rules")
        for row in rows:
            cells = []
            for b in matrix.backends:
                cell = row.cells.get(b)
                text = paint(cell.label, cell.status) if cell else "."
                cells.append(text + " " * (widths[b] - len(cell.label if cell else ".")))
            lines.append(f"  {names[row.rule].ljust(name_width)}  " + "  ".join(cells).rstrip())
    lines.append(LEGEND)
    failed = findings(doc.results, (FAIL, XPASS))
    if failed:
        lines += ["", f"failures ({len(failed)}):"]
        for finding in failed:
            lines.append(f"  {_LETTERS[finding.result.outcome]} {finding.title}")
            lines += [f"      {line}".rstrip() for line in finding.result.reason.splitlines()]
            lines.append(f"    reproduce: {finding.result.repro}")
    return lines


def render_changes_text(changes: Sequence[CellChange]) -> list[str]:
    if not changes:
        return ["no cell changed"]
    return [f"{c.kind:14} {c.rule:4} {c.backend:12} {c.before or '-'} -> {c.after or '-'}" for c in changes]


# --- provenance ---------------------------------------------------------------------------------------

_PROVENANCE_LABELS = {
    "pytest_ptn": "pytest-ptn",
    "torch": "torch",
    "executorch": "executorch",
    "python": "Python",
    "git_commit": "git",
    "device": "device",
    "platform": "platform",
    "time": "at",
}


def provenance_line(prov: dict[str, str]) -> str:
    parts = []
    for key, label in _PROVENANCE_LABELS.items():
        if key in prov:
            value = prov[key][:12] if key == "git_commit" else prov[key]
            parts.append(f"{label} {value}")
    parts += [f"{k} {v}" for k, v in prov.items() if k not in _PROVENANCE_LABELS and k != "backends"]
    return " · ".join(parts)


def _provenance_lines(doc: Results) -> list[str]:
    """One line for a single run; one per source run (prefixed by its backends) for a merged document."""
    if not doc.sources:
        return [provenance_line(doc.provenance)]
    return [f"{s.get('backends', '?')}: {provenance_line(s)}" for s in doc.sources]


# --- Markdown -----------------------------------------------------------------------------------------

_EMOJI = {FAIL: "❌", XFAIL: "⚠️", PASS: "✅", NOT_APPLICABLE: "➖", SKIP: "⏭️"}


def _md(text: str) -> str:
    """Table-cell text: no line breaks, pipes escaped, and no raw HTML for GitHub to swallow."""
    return html.escape(" ".join(text.split()), quote=False).replace("|", "\\|")


def _md_code(text: str) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _md_lines(text: str) -> str:
    """Table-cell text that keeps its lines: each line as `_md`, joined by the one tag a cell allows."""
    return "<br>".join(_md(line) for line in text.splitlines() if line.strip())


def _md_results_table(found: Sequence[Finding]) -> list[str]:
    lines = ["| rule | backend | scenario | outcome | reason | reproduce |", "|---|---|---|---|---|---|"]
    for finding in found:
        r = finding.result
        scenario = r.scenario or ""
        if r.seed is not None:
            scenario += f" (seed {r.seed})"
        lines.append(
            f"| {_md(', '.join(finding.rules))} | {_md(r.backend)} | {_md(scenario)} | {r.outcome} | "
            f"{_md_lines(r.reason)} | {_md_code(r.repro)} |"
        )
    return lines


def render_markdown(doc: Results, changes: Sequence[CellChange] | None = None) -> str:
    """Sized for $GITHUB_STEP_SUMMARY: verdict, provenance, matrix, then what failed and how to rerun it."""
    matrix = build_matrix(doc.results)
    lines = [f"## pytest-ptn conformance (spec v{doc.spec_version})", ""]
    lines += [_verdict(matrix), ""]
    lines += [f"<sub>{_md(p)}</sub><br>" for p in _provenance_lines(doc)] + [""]
    if changes is not None:
        lines += ["### Changes since previous run", ""]
        if changes:
            lines += ["| change | rule | backend | before | after |", "|---|---|---|---|---|"]
            lines += [
                f"| {c.kind} | {_md(c.rule)} | {_md(c.backend)} | {c.before or '—'} | {c.after or '—'} |"
                for c in changes
            ]
        else:
            lines.append("No cell changed.")
        lines.append("")
    if not matrix.rows:
        lines.append("No conformance results.")
        return "\n".join(lines) + "\n"
    header = "| rule | " + " | ".join(_md(b) for b in matrix.backends) + " |"
    separator = "|---|" + "---|" * len(matrix.backends)
    for level, rows in matrix.sections():
        lines += [f"### {level} rules", "", header, separator]
        for row in rows:
            cells = []
            for b in matrix.backends:
                cell = row.cells.get(b)
                cells.append(f"{_EMOJI[cell.status]} {cell.words}" if cell else "")
            lines.append(f"| **{_md(row.rule)}** {_md(row.title)} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [
        "✅ pass · ❌ fail or unexpected pass (xpass) · ⚠️ expected failure: a known bug · "
        "➖ not applicable · ⏭️ skipped",
        "",
    ]
    failures = findings(doc.results, (FAIL, XPASS))
    if failures:
        lines += ["### Failures", ""] + _md_results_table(failures) + [""]
    xfails = findings(doc.results, (XFAIL,))
    if xfails:
        lines += [f"<details><summary>Expected failures (known bugs): {len(xfails)}</summary>", ""]
        lines += _md_results_table(xfails) + ["", "</details>", ""]
    return "\n".join(lines)


def _verdict(matrix: Matrix) -> str:
    parts = []
    for level, failing, ran in _verdicts(matrix):
        cells = ", ".join(f"{rule} on {backend}" for rule, backend in failing)
        parts.append(
            f"**{level}: {len(failing)} failing** ({cells})"
            if failing
            else f"**{level}: {'all pass' if ran else NOTHING_RAN}**"
        )
    return " · ".join(parts) or "No conformance results."


def _verdicts(matrix: Matrix) -> list[tuple[str, list[tuple[str, str]], bool]]:
    """(level, failing (rule, backend) cells, whether any of its tests ran) for each MUST/SHOULD level that
    has results. A level whose every cell is n/a or skipped ran nothing: it did not "all pass"."""
    present = {row.level for row in matrix.rows}
    return [
        (
            level,
            matrix.failing(level),
            any(
                c.status not in (NOT_APPLICABLE, SKIP)
                for row in matrix.rows
                if row.level == level
                for c in row.cells.values()
            ),
        )
        for level in _LEVELS
        if level in present
    ]


# --- HTML ---------------------------------------------------------------------------------------------

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2328;
       margin: 24px; max-width: 1400px; }
h1 { font-size: 22px; margin: 0 0 4px; } h1 small { font-weight: normal; color: #59636e; font-size: 15px; }
h2 { font-size: 17px; margin: 28px 0 8px; }
.verdict { font-size: 16px; margin: 8px 0; }
.verdict .bad { color: #b3261e; font-weight: 700; } .verdict .good { color: #1a7f37; font-weight: 700; }
.prov { color: #59636e; font-size: 12px; margin: 2px 0; }
.legend { margin: 12px 0; display: flex; gap: 18px; flex-wrap: wrap; font-size: 13px; align-items: center; }
.legend .fail, .legend .xfail, .legend .pass, .legend .na { display: inline-block; padding: 1px 8px;
  border-radius: 4px; margin-right: 4px; }
table { border-collapse: collapse; margin-top: 12px; }
tr.newly-failing td { color: #b3261e; font-weight: 700; }
table.matrix th, table.matrix td { border: 1px solid #d0d7de; padding: 5px 10px; vertical-align: top; }
table.matrix thead th { background: #f6f8fa; text-align: center; min-width: 130px; font-size: 15px; }
table.matrix th.rule { text-align: left; font-weight: normal; white-space: nowrap; background: #fff; }
table.matrix th.rule b { display: inline-block; min-width: 2.6em; }
tr.level th { background: #eaeef2; text-align: left; font-size: 12px; letter-spacing: .06em; }
.fail { background: #cf222e; color: #fff; font-weight: 600; }
.xfail { background: #ffe58a; color: #4d2d00; }
.pass { background: #e6f6ea; color: #1a7f37; }
.na { background: #f6f8fa; color: #8c959f; }
td.none { background: #fff; color: #afb8c1; text-align: center; }
.status { font-weight: 800; letter-spacing: .03em; margin-right: 6px; }
details summary { cursor: pointer; }
details ul { margin: 6px 0 2px; padding: 6px 10px 6px 24px; max-width: 34em; background: #fff; color: #1f2328;
  font-weight: normal; border-radius: 4px; }
details li { margin-bottom: 6px; }
pre.reason { white-space: pre-wrap; overflow-wrap: anywhere; margin: 2px 0 4px; font: 12px/1.4 ui-monospace,
  SFMono-Regular, Menlo, monospace; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; background: #f6f8fa;
       padding: 1px 3px; border-radius: 3px; overflow-wrap: anywhere; }
.badge { font-size: 11px; font-weight: 700; padding: 0 4px; border-radius: 3px; }
table.list th, table.list td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left;
  vertical-align: top; }
table.list th { background: #f6f8fa; }
"""
_CSS_CLASS = {FAIL: "fail", XPASS: "fail", XFAIL: "xfail", PASS: "pass", NOT_APPLICABLE: "na", SKIP: "na"}


def _h(text: object) -> str:
    return html.escape(str(text))


def _html_badge(outcome: str) -> str:
    return f'<span class="badge {_CSS_CLASS[outcome]}">{_h(_WORDS[outcome].upper())}</span>'


def _html_result_item(r: Result) -> str:
    scenario = _h(r.scenario) if r.scenario else "<i>no scenario</i>"
    seed = f" · seed {r.seed}" if r.seed is not None else ""
    return (
        f'<li>{_html_badge(r.outcome)} <b>{scenario}</b>{seed}<pre class="reason">{_h(r.reason)}</pre>'
        f"<code>{_h(r.repro)}</code></li>"
    )


def _html_cell(cell: Cell | None) -> str:
    """Quiet cells for pass and n/a; a bold word and an opener where a reader has something to look at."""
    if cell is None:
        return '<td class="none" title="not tested">·</td>'
    head = _h(cell.words)
    if cell.status in (FAIL, XFAIL):
        head = f'<span class="status">{cell.status.upper()}</span>{head}'
    reasons = {one_line(r.reason, 120) for r in cell.results if r.outcome == NOT_APPLICABLE}
    title = f' title="{_h("; ".join(sorted(reasons)))}"' if reasons else ""
    css = _CSS_CLASS[cell.status]
    if not cell.notable:
        return f'<td class="{css}"{title}>{head}</td>'
    items = "".join(_html_result_item(r) for r in cell.notable)
    return f'<td class="{css}"{title}><details><summary>{head}</summary><ul>{items}</ul></details></td>'


def _html_results_table(found: Sequence[Finding]) -> str:
    rows = "".join(
        f"<tr><td><b>{_h(', '.join(f.rules))}</b></td><td>{_h(f.result.backend)}</td>"
        f"<td>{_h(f.result.scenario or '')}</td><td>{_html_badge(f.result.outcome)}</td>"
        f'<td><pre class="reason">{_h(f.result.reason)}</pre></td>'
        f"<td><code>{_h(f.result.repro)}</code></td></tr>"
        for f in found
    )
    return (
        '<table class="list"><tr><th>rule</th><th>backend</th><th>scenario</th><th>outcome</th>'
        f"<th>reason</th><th>reproduce</th></tr>{rows}</table>"
    )


def render_html(doc: Results, changes: Sequence[CellChange] | None = None) -> str:
    """One self-contained page (inline CSS, no JS): failing and xfail cells open to scenarios and repros."""
    matrix = build_matrix(doc.results)
    out = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>pytest-ptn conformance (spec v{_h(doc.spec_version)})</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>pytest-ptn conformance <small>spec v{_h(doc.spec_version)}</small></h1>",
    ]
    verdict = []
    for level, failing, ran in _verdicts(matrix):
        cells = ", ".join(f"{rule} on {backend}" for rule, backend in failing)
        verdict.append(
            f'<span class="bad">{level}: {len(failing)} failing</span> ({_h(cells)})'
            if failing
            else f'<span class="good">{level}: all pass</span>'
            if ran
            else f'<span class="na">{level}: {NOTHING_RAN}</span>'
        )
    out.append(f'<p class="verdict">{" · ".join(verdict) or "No conformance results."}</p>')
    out += [f'<p class="prov">{_h(p)}</p>' for p in _provenance_lines(doc)]
    out.append(
        '<div class="legend"><span><span class="fail">FAIL</span>fail or unexpected pass (xpass)</span>'
        '<span><span class="xfail">XFAIL</span>expected failure: a known bug</span>'
        '<span><span class="pass">pass</span></span>'
        '<span><span class="na">n/a</span>not applicable or skipped</span>'
        "<span>&#9656; click a cell for its scenarios, reasons and reproducers</span></div>"
    )
    if changes is not None:
        out.append("<h2>Changes since previous run</h2>")
        if changes:
            change_rows = "".join(
                f'<tr class="{c.kind.replace(" ", "-")}"><td><b>{_h(c.kind)}</b></td>'
                f"<td>{_h(c.rule)}</td><td>{_h(c.backend)}</td>"
                f"<td>{_h(c.before or '—')}</td><td>{_h(c.after or '—')}</td></tr>"
                for c in changes
            )
            out.append(
                '<table class="list"><tr><th>change</th><th>rule</th><th>backend</th><th>before</th>'
                f"<th>after</th></tr>{change_rows}</table>"
            )
        else:
            out.append("<p>No cell changed.</p>")
    if matrix.rows:
        out.append('<table class="matrix"><thead><tr><th>rule</th>')
        out += [f"<th>{_h(b)}</th>" for b in matrix.backends]
        out.append("</tr></thead><tbody>")
        for level, rows in matrix.sections():
            out.append(
                f'<tr class="level"><th colspan="{len(matrix.backends) + 1}">{_h(level)} rules</th></tr>'
            )
            for row in rows:
                out.append(f'<tr><th class="rule"><b>{_h(row.rule)}</b> {_h(row.title)}</th>')
                out += [_html_cell(row.cells.get(b)) for b in matrix.backends]
                out.append("</tr>")
        out.append("</tbody></table>")
    failures = findings(doc.results, (FAIL, XPASS))
    if failures:
        out += ["<h2>Failures</h2>", _html_results_table(failures)]
    xfails = findings(doc.results, (XFAIL,))
    if xfails:
        out += ["<h2>Expected failures (known bugs)</h2>", _html_results_table(xfails)]
    out.append("</body></html>\n")
    return "\n".join(out)
