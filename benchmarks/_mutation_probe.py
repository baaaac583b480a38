"""The pytest plugin benchmarks/mutation.py loads into each run of the suite on a mutant
(``-p _mutation_probe``).

For every failed test it writes one JSON line to ``$PTN_MUTATION_PROBE``: whether the test failed with a
finding (a check's ``pytest.fail``, the test's own ``assert``, or an exception raised with the backend under
test on the stack) or with a crash of the harness (any other exception: the plugin's own code broke, which
kills no mutant). The first finding stops the run as ``-x`` would (exit status 1), so a killed mutant costs
only the tests up to it; a crash does not stop it, since a later test may still find the mutant.
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

FINDING = "finding"
CRASH = "crash"
_PACKAGE = f"{os.sep}pytest_ptn{os.sep}"


def _backend_files() -> tuple[str, ...]:
    """Where the reference backend's code lives: the package the run imports (the mutated copy)."""
    import pytest_ptn

    root = Path(pytest_ptn.__file__).parent
    return (str(root / "reference") + os.sep, str(root / "backends" / "reference.py"))


def _stack(error: BaseException) -> list[tuple[str, int, str]]:
    """(file, line, function) of each frame of ``error``'s own traceback, innermost last."""
    out, tb = [], error.__traceback__
    while tb is not None:
        out.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    return out


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the exceptions it was raised from or while handling."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop(0)
        if e is not None and id(e) not in seen:
            seen.add(id(e))
            yield e
            todo += [e.__cause__, e.__context__]


def verdict(item: pytest.Item, error: BaseException) -> tuple[str, str]:
    """(FINDING or CRASH, where a crash was raised: its innermost frame in pytest_ptn, else its innermost)."""
    if isinstance(error, pytest.fail.Exception):
        return FINDING, ""
    if any(f.startswith(_backend_files()) for e in _chain(error) for f, _, _ in _stack(e)):
        return FINDING, ""
    stack = _stack(error) or [("?", 0, "?")]
    if isinstance(error, AssertionError) and stack[-1][0] == str(item.path):
        return FINDING, ""
    file, line, name = ([f for f in stack if _PACKAGE in f[0]] or stack)[-1]
    return CRASH, f"{file.rsplit(_PACKAGE, 1)[-1]}:{line} in {name}"


def _write(record: dict[str, object]) -> None:
    path = os.environ.get("PTN_MUTATION_PROBE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        error = call.excinfo.value if call.excinfo is not None else None
        kind, where = verdict(item, error) if error is not None else (CRASH, "failed without an exception")
        text = f"{type(error).__name__}: {error}" if error is not None else ""
        _write(
            {"nodeid": item.nodeid, "when": call.when, "verdict": kind, "where": where, "error": text[:300]}
        )
        if kind == FINDING:
            item.session.shouldfail = f"mutant killed by {item.nodeid}"
    return report


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _write(
            {"nodeid": report.nodeid, "when": "collect", "verdict": CRASH, "where": "collection", "error": ""}
        )
