"""The causes of a run's failures (reporting.causes) as each report leads with them: terminal lines, a
Markdown section and an HTML section, largest cause first, one example failure and its command each."""

from __future__ import annotations

import html
from collections.abc import Sequence

from pytest_ptn.reporting.causes import Cause

MAX_SCENARIOS_NAMED = 12
"""Scenarios a terminal cause names before it only counts the rest."""
MAX_TESTS_SHOWN = 200
"""Test ids a Markdown or HTML cause lists before it only counts the rest."""


def _headline(causes: Sequence[Cause]) -> str:
    tests = sum(len(c.found) for c in causes)
    word = "cause explains" if len(causes) == 1 else "causes explain"
    return f"{len(causes)} {word} the {tests} failing test{'s' * (tests != 1)}, largest first"


def _joined(cause: Cause) -> str:
    if not cause.joined:
        return ""
    return f"; {cause.joined} of them show only a symptom, in a case where this cause is shown"


def _scenarios(cause: Cause) -> list[str]:
    """The scenarios one mechanism shows in, named where there are several."""
    scenarios = cause.scenarios
    if len(scenarios) < 2:
        return []
    more = len(scenarios) - MAX_SCENARIOS_NAMED
    named = ", ".join(scenarios[:MAX_SCENARIOS_NAMED]) + (f" and {more} more" if more > 0 else "")
    return [f"      in {named}"]


def text_lines(causes: Sequence[Cause]) -> list[str]:
    if not causes:
        return []
    lines = [f"{_headline(causes)}:"]
    for cause in causes:
        example = cause.example
        lines += [
            f"  cause {cause.number} on {cause.backend}: {cause.summary}",
            f"      explains {cause.explains()}{_joined(cause)}",
            *_scenarios(cause),
            f"      example: {example.title}",
            f"      reproduce: {example.result.repro}",
        ]
    return lines


def _md(text: str) -> str:
    return html.escape(" ".join(text.split()), quote=False)


def fenced(text: str, language: str = "") -> list[str]:
    """A Markdown code block of ``text`` as it is, its fence longer than any run of backticks inside."""
    fence = "```"
    while fence in text:
        fence += "`"
    return [f"{fence}{language}", text, fence]


def markdown_lines(causes: Sequence[Cause]) -> list[str]:
    if not causes:
        return []
    lines = ["### Causes", "", f"{_headline(causes)}.", ""]
    for cause in causes:
        example = cause.example
        lines += [
            f"{cause.number}. **{_md(cause.summary)}** ({_md(cause.backend)})<br>",
            f"   explains {_md(cause.explains())}{_md(_joined(cause))}<br>",
            f"   example: {_md(example.title)}; reproduce:",
            "",
            *[f"   {line}" for line in fenced(example.result.repro, "sh")],
            "",
            f"   <details><summary>the {len(cause.found)} tests</summary>",
            "",
            *[f"   - `{nodeid}`" for nodeid in cause.tests[:MAX_TESTS_SHOWN]],
            *(
                [f"   - ... and {len(cause.tests) - MAX_TESTS_SHOWN} more"]
                if len(cause.tests) > MAX_TESTS_SHOWN
                else []
            ),
            "",
            "   </details>",
            "",
        ]
    return lines


def html_section(causes: Sequence[Cause]) -> str:
    if not causes:
        return ""
    items = []
    for cause in causes:
        example = cause.example
        tests = "".join(f"<li><code>{html.escape(t)}</code></li>" for t in cause.tests[:MAX_TESTS_SHOWN])
        more = len(cause.tests) - MAX_TESTS_SHOWN
        if more > 0:
            tests += f"<li>... and {more} more</li>"
        items.append(
            f"<li><b>{html.escape(cause.summary)}</b> ({html.escape(cause.backend)})<br>"
            f"explains {html.escape(cause.explains() + _joined(cause))}<br>"
            f"example: {html.escape(example.title)}<br>"
            f"reproduce: <code>{html.escape(example.result.repro)}</code>"
            f"<details><summary>the {len(cause.found)} tests</summary><ul>{tests}</ul></details></li>"
        )
    return f'<h2>Causes</h2><p>{html.escape(_headline(causes))}.</p><ol class="causes">{"".join(items)}</ol>'
