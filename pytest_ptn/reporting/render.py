"""The three views of one results model: terminal text, Markdown (summary.md) and HTML (index.html)."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from pytest_ptn.fuzzing.tally import FuzzTally, merged
from pytest_ptn.reporting import cause_views
from pytest_ptn.reporting.cause_views import fenced
from pytest_ptn.reporting.causes import cause_of, find_causes
from pytest_ptn.reporting.held import held_shares
from pytest_ptn.reporting.matrix import (
    Cell,
    CellChange,
    Matrix,
    ReportedTest,
    build_matrix,
    intermittent_count,
    intermittent_tests,
    reported_tests,
)
from pytest_ptn.reporting.reasons import headline
from pytest_ptn.reporting.results import (
    FAIL,
    NOT_APPLICABLE,
    NOT_EXERCISED,
    OUTCOME_LETTERS,
    OUTCOME_WORDS,
    PASS,
    SKIP,
    XFAIL,
    XPASS,
    Result,
    Results,
    one_line,
    save,
    write_whole,
)
from pytest_ptn.ruleset import LEVELS, NOT_APPLICABLE_PREFIX, SHOULD

LEGEND = (
    "legend: F fail  X xpass (a fail)  x xfail (known bug)  e not exercised (the backend held none of the "
    "checked constants)  p pass  - n/a  s skip  . not run  i intermittent (listed as passing or failing by "
    "timing)"
)
INTERMITTENT_MEANING = "listed as passing or failing by timing: either is expected, never stale"
SHOULD_COUNTING = (
    "a SHOULD test that fails is F here and xfailed to pytest: it is a failure of that rule, not of the run"
)

NOTHING_RAN = NOT_APPLICABLE_PREFIX
"""The verdict of a level none of whose tests ran (every cell n/a or skipped)."""

NONE_FAILING_SO_FAR = "none failing of the tests that finished"
"""The verdict of a level without failures in an incomplete run: never "all pass" over unchecked tests."""

REPORT_FILES = ("results.json", "summary.md", "index.html")

# --- text ---------------------------------------------------------------------------------------------

Paint = Callable[[str, str], str]
_NAME_WIDTH = 36


def _no_paint(text: str, status: str) -> str:
    return text


def shown_by_pytest(test: ReportedTest) -> bool:
    """Whether pytest's own FAILURES section shows this failing test (a SHOULD one is an xfail to pytest)."""
    return not (test.result.outcome == FAIL and test.result.level == SHOULD)


def failure_count(failed: Sequence[ReportedTest]) -> str:
    """How many tests failed, in pytest's terms too: failed (and errors), and the SHOULD ones it xfails."""
    should = sum(1 for f in failed if not shown_by_pytest(f))
    if not should:
        return f"failing tests ({len(failed)})"
    return (
        f"failing tests ({len(failed)}: {len(failed) - should} failed or errors to pytest, {should} SHOULD "
        f"not met, xfailed to pytest)"
    )


def render_text(doc: Results, paint: Paint = _no_paint, pytest_showed: bool = False) -> list[str]:
    """The terminal report: the causes, the matrix, then each failing test. `paint(text, status)` may colour
    a cell's text (padding is added after). With `pytest_showed` (the run's own terminal), a failure that
    pytest's FAILURES section showed is listed by name and command, its text not printed again."""
    matrix = build_matrix(doc.results)
    incomplete = [paint(doc.incomplete_headline, FAIL)] if doc.incomplete_headline else []
    if not matrix.rows:
        return [*incomplete, "no conformance results"]
    causes = find_causes(doc.results)
    numbers = cause_of(causes)
    lines = [*incomplete, *cause_views.text_lines(causes)]
    if len(lines) > len(incomplete):
        lines.append("")
    id_width = max(len(row.rule) for row in matrix.rows) + 1
    names = {row.rule: f"{row.rule.ljust(id_width)} {row.title}"[:_NAME_WIDTH] for row in matrix.rows}
    name_width = max(len(name) for name in names.values())
    widths = {
        b: max([len(b)] + [len(row.cells[b].label) for row in matrix.rows if b in row.cells])
        for b in matrix.backends
    }
    lines.append(" " * (name_width + 4) + "  ".join(b.ljust(widths[b]) for b in matrix.backends).rstrip())
    for level, rows in matrix.sections():
        lines.append(f"{level} rules")
        for row in rows:
            cells = []
            for b in matrix.backends:
                cell = row.cells.get(b)
                text = paint(cell.label, cell.status) if cell else "."
                cells.append(text + " " * (widths[b] - len(cell.label if cell else ".")))
            lines.append(f"  {names[row.rule].ljust(name_width)}  " + "  ".join(cells).rstrip())
    lines += [LEGEND, SHOULD_COUNTING]
    shares = held_shares(doc.results)
    if shares:
        lines += ["", *(share.line(b) for b, share in shares.items())]
    tallies = fuzz_tallies(doc.results)
    if tallies:
        lines += ["", *(line for b, tally in tallies.items() for line in (tally.line(b), tally.coverage(b)))]
    intermittent = intermittent_tests(doc.results)
    if intermittent:
        lines += ["", f"{intermittent_count(intermittent)}, {INTERMITTENT_MEANING}:"]
        lines += [f"  i {f.title}: {_did(f)}" for f in intermittent]
    failed = reported_tests(doc.results, (FAIL, XPASS))
    if failed:
        lines += ["", f"{failure_count(failed)}:"]
        for test in failed:
            number = numbers[(test.result.nodeid, test.result.backend)]
            lines.append(f"  {OUTCOME_LETTERS[test.result.outcome]} {test.title} (cause {number})")
            if not (pytest_showed and shown_by_pytest(test)):
                lines += [f"      {line}".rstrip() for line in test.result.reason.splitlines()]
            lines.append(f"    reproduce: {test.result.repro}")
    return lines


def _did(test: ReportedTest) -> str:
    return "passed this time" if test.result.outcome == PASS else "failed this time"


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

_EMOJI = {FAIL: "❌", XFAIL: "⚠️", NOT_EXERCISED: "🔘", PASS: "✅", NOT_APPLICABLE: "➖", SKIP: "⏭️"}


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


MD_CELL_LINES = 6
"""A reason longer than this (a fuzz failure's program) gets its first line in the table and its whole
text in a code block below it, which pastes as it was printed."""


def _md_results_table(found: Sequence[ReportedTest]) -> list[str]:
    lines = ["| rule | backend | scenario | outcome | reason | reproduce |", "|---|---|---|---|---|---|"]
    blocks: list[str] = []
    for test in found:
        r = test.result
        scenario = r.scenario or ""
        if r.seed is not None:
            scenario += f" (seed {r.seed})"
        reason = _md_lines(r.reason)
        if len([line for line in r.reason.splitlines() if line.strip()]) > MD_CELL_LINES:
            reason = f"{_md(headline(r.reason))}<br>(whole text below: {_md(test.title)})"
            blocks += [f"<details><summary>{_md(test.title)}: the whole text</summary>", ""]
            blocks += [*fenced(r.reason), "", "</details>", ""]
        lines.append(
            f"| {_md(', '.join(test.rules))} | {_md(r.backend)} | {_md(scenario)} | {r.outcome} | "
            f"{reason} | {_md_code(r.repro)} |"
        )
    return lines + ([""] + blocks if blocks else [])


def render_markdown(doc: Results, changes: Sequence[CellChange] | None = None) -> str:
    """Sized for $GITHUB_STEP_SUMMARY: verdict, provenance, matrix, then what failed and how to rerun it."""
    matrix = build_matrix(doc.results)
    lines = [f"## pytest-ptn conformance (spec v{doc.spec_version})", ""]
    if doc.incomplete_headline:
        lines += [f"**⚠️ {_md(doc.incomplete_headline)}**", ""]
    lines += [_verdict(matrix, doc.complete), ""]
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
    lines += cause_views.markdown_lines(find_causes(doc.results))
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
        "🔘 not exercised: the backend held none of the checked constants · "
        "➖ not applicable · ⏭️ skipped · intermittent: listed as passing or failing by timing",
        "",
        f"{SHOULD_COUNTING}.",
        "",
    ]
    shares = held_shares(doc.results)
    if shares:
        lines += ["### Constants held", ""]
        lines += [f"- {_md(share.line(b))}" for b, share in shares.items()] + [""]
    tallies = fuzz_tallies(doc.results)
    if tallies:
        lines += ["### Fuzz", ""]
        for backend, tally in tallies.items():
            lines += [f"- {_md(tally.line(backend))}", f"- {_md(tally.coverage(backend))}"]
            for key, seen in tally.ordered():
                lines += [f"<details><summary>smallest program of {_md(key)}</summary>", ""]
                lines += [*fenced(seen.smallest.rstrip("\n"), "python"), "", "</details>", ""]
        lines.append("")
    failures = reported_tests(doc.results, (FAIL, XPASS))
    if failures:
        lines += ["### Failures", ""] + _md_results_table(failures) + [""]
    intermittent = intermittent_tests(doc.results)
    if intermittent:
        head = f"Intermittent: {intermittent_count(intermittent)}, {INTERMITTENT_MEANING}"
        lines += [f"<details><summary>{_md(head)}</summary>", ""]
        lines += _md_results_table(intermittent) + ["", "</details>", ""]
    xfails = reported_tests(doc.results, (XFAIL,))
    if xfails:
        lines += [f"<details><summary>Expected failures (known bugs): {len(xfails)}</summary>", ""]
        lines += _md_results_table(xfails) + ["", "</details>", ""]
    return "\n".join(lines)


def fuzz_tallies(rows: Sequence[Result]) -> dict[str, FuzzTally]:
    """backend -> its fuzz test's tally, the shares of the fuzz budget (workers, machines) merged."""
    by_backend: dict[str, list[FuzzTally]] = {}
    seen: set[str] = set()
    for r in rows:
        if r.fuzz is not None and r.nodeid not in seen:  # one tally a test, whatever rules it checks
            seen.add(r.nodeid)
            by_backend.setdefault(r.backend, []).append(r.fuzz)
    return {b: merged(tallies) for b, tallies in sorted(by_backend.items())}


def _verdict(matrix: Matrix, complete: bool = True) -> str:
    parts = []
    for level, failing, ran in _verdicts(matrix):
        cells = ", ".join(f"{rule} on {backend}" for rule, backend in failing)
        parts.append(
            f"**{level}: {len(failing)} failing** ({cells})"
            if failing
            else f"**{level}: {_no_failure(ran, complete)}**"
        )
    return " · ".join(parts) or "No conformance results."


def _no_failure(ran: bool, complete: bool) -> str:
    return NOTHING_RAN if not ran else "all pass" if complete else NONE_FAILING_SO_FAR


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
        for level in LEVELS
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
_CSS_CLASS = {
    FAIL: "fail",
    XPASS: "fail",
    XFAIL: "xfail",
    NOT_EXERCISED: "na",
    PASS: "pass",
    NOT_APPLICABLE: "na",
    SKIP: "na",
}


def _h(text: object) -> str:
    return html.escape(str(text))


def _html_badge(outcome: str) -> str:
    return f'<span class="badge {_CSS_CLASS[outcome]}">{_h(OUTCOME_WORDS[outcome].upper())}</span>'


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
    reasons = {one_line(r.reason, 120) for r in cell.results if r.outcome in (NOT_APPLICABLE, NOT_EXERCISED)}
    title = f' title="{_h("; ".join(sorted(reasons)))}"' if reasons else ""
    css = _CSS_CLASS[cell.status]
    if not cell.notable:
        return f'<td class="{css}"{title}>{head}</td>'
    items = "".join(_html_result_item(r) for r in cell.notable)
    return f'<td class="{css}"{title}><details><summary>{head}</summary><ul>{items}</ul></details></td>'


def _html_results_table(found: Sequence[ReportedTest]) -> str:
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
            if ran and doc.complete
            else f'<span class="na">{level}: {_no_failure(ran, doc.complete)}</span>'
        )
    if doc.incomplete_headline:
        out.append(f'<p class="verdict"><span class="bad">{_h(doc.incomplete_headline)}</span></p>')
    out.append(f'<p class="verdict">{" · ".join(verdict) or "No conformance results."}</p>')
    out += [f'<p class="prov">{_h(p)}</p>' for p in _provenance_lines(doc)]
    out.append(
        '<div class="legend"><span><span class="fail">FAIL</span>fail or unexpected pass (xpass)</span>'
        '<span><span class="xfail">XFAIL</span>expected failure: a known bug</span>'
        '<span><span class="pass">pass</span></span>'
        '<span><span class="na">n/a</span>not applicable or skipped</span>'
        '<span><span class="na">not exercised</span>the backend held none of the checked constants</span>'
        "<span>intermittent: listed as passing or failing by timing</span>"
        "<span>&#9656; click a cell for its scenarios, reasons and reproducers</span>"
        f"<span>{_h(SHOULD_COUNTING)}</span></div>"
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
        out.append(cause_views.html_section(find_causes(doc.results)))
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
    shares = held_shares(doc.results)
    if shares:
        out += ["<h2>Constants held</h2>", "<ul>"]
        out += [f"<li>{_h(share.line(b))}</li>" for b, share in shares.items()] + ["</ul>"]
    failures = reported_tests(doc.results, (FAIL, XPASS))
    if failures:
        out += ["<h2>Failures</h2>", _html_results_table(failures)]
    intermittent = intermittent_tests(doc.results)
    if intermittent:
        head = f"Intermittent: {intermittent_count(intermittent)}"
        out += [f"<h2>{_h(head)}</h2>", f"<p>{_h(INTERMITTENT_MEANING)}.</p>"]
        out.append(_html_results_table(intermittent))
    xfails = reported_tests(doc.results, (XFAIL,))
    if xfails:
        out += ["<h2>Expected failures (known bugs)</h2>", _html_results_table(xfails)]
    out.append("</body></html>\n")
    return "\n".join(out)


def write_reports(doc: Results, outdir: Path, changes: Sequence[CellChange] | None = None) -> list[Path]:
    """Write results.json, summary.md and index.html into `outdir`; return their paths."""
    outdir.mkdir(parents=True, exist_ok=True)
    json_path, md_path, html_path = (outdir / name for name in REPORT_FILES)
    derived: dict[str, object] = {"causes": [cause.to_dict() for cause in find_causes(doc.results)]}
    intermittent = intermittent_tests(doc.results)
    if intermittent:
        derived["intermittent"] = {
            "tests": len(intermittent),
            "passed": sum(f.result.outcome == PASS for f in intermittent),
            "failed": sum(f.result.outcome == XFAIL for f in intermittent),
        }
    save(doc, json_path, derived)
    write_whole(md_path, render_markdown(doc, changes))
    write_whole(html_path, render_html(doc, changes))
    return [json_path, md_path, html_path]
