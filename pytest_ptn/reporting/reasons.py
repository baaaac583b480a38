"""Reading a failure's text: the one line that says what is wrong.

A conformance failure often opens with a header ("outputs differ from eager:") whose finding is on the next
line, and pytest adds the ``assert`` expression it re-renders and the exception's type. A baseline entry, a
cause and a table cell want the finding itself.
"""

from __future__ import annotations

from pytest_ptn.reporting.results import one_line

NOISE_PREFIXES = ("Failed: ", "AssertionError: ")
"""What pytest puts before a test's own message: ``pytest.fail`` and a bare ``assert ..., message``."""


def headline(failure: str, limit: int = 300) -> str:
    """The failure's first line that says something, joined to its first detail when it is only a header
    (ends with ``:``), without an ``assert`` expression pytest re-renders below a test's own message and
    without the prefixes every such message starts with."""
    lines = [line.strip() for line in failure.splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith("assert ")] or lines
    if not said:
        return "fails"
    first = strip_noise(said[0])
    if first.endswith(":") and len(said) > 1:
        first = f"{first} {said[1]}"
    return one_line(first, limit)


def strip_noise(line: str) -> str:
    for prefix in NOISE_PREFIXES:
        line = line.removeprefix(prefix)
    return line
