"""What torch, executorch and torchao say while a backend lowers, loads and runs is never a verdict.

Upstream toolchains warn (deprecations, a notice per mutated buffer) and log (``torch.__trace`` logs at DEBUG
whatever the host's level). In a repository whose pytest configuration has ``filterwarnings = error`` or
``log_level = DEBUG``, an upstream deprecation would fail a valid program, and a failure would come
buried under hundreds of empty records. So inside :func:`contained` warnings are counted (in a
:class:`Tally`), never raised or shown, and inside :func:`quiet_logs` upstream loggers' DEBUG and INFO
records reach no handler. :func:`shown` lets both through, for ``--ptn-upstream-logs``.

Imports neither pytest nor torch: backends contain their toolchain calls with :func:`contained` too, so
their callers outside the plugin (a measuring subprocess, a project's own tests) judge alike.
"""

from __future__ import annotations

import functools
import logging
import sys
import sysconfig
import types
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TextIO

SHOW_OPTION = "--ptn-upstream-logs"
"""The pytest option under which upstream warnings and logs go through to pytest as usual."""

UPSTREAM_LOGGERS = ("torch", "executorch", "torchao")
"""Loggers (with their children) whose records below WARNING are upstream chatter."""

SUMMARY_KINDS = 5
"""Kinds of warning (category, package) the summary names; the rest are counted only."""

TallyRow = tuple[str, str, int]
"""(warning category, package that raised it, count): plain values, so xdist workers can send them."""


class Tally:
    """Contained warnings, by category and the package whose code raised them."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()

    def record(self, caught: Iterable[tuple[str, str]]) -> None:
        """Count (category, package) pairs, as :func:`contained` notes them."""
        self.counts.update(caught)

    def rows(self) -> list[TallyRow]:
        return [(category, package, n) for (category, package), n in self.counts.most_common()]

    def merge(self, rows: Iterable[TallyRow]) -> None:
        for category, package, n in rows:
            self.counts[category, package] += n

    def summary(self) -> str | None:
        """One line for the end of a run, or None when nothing was contained."""
        if not self.counts:
            return None
        rows = self.rows()
        kinds = [f"{category} x{n} from {package}" for category, package, n in rows[:SUMMARY_KINDS]]
        if len(rows) > SUMMARY_KINDS:
            kinds.append(f"{len(rows) - SUMMARY_KINDS} more kinds")
        total = sum(n for _, _, n in rows)
        return (
            f"{total} upstream warnings while backends lowered, loaded and ran ({', '.join(kinds)}); "
            f"shown with {SHOW_OPTION}"
        )


_DECIDED: ContextVar[bool] = ContextVar("ptn_upstream_policy_decided", default=False)
"""Whether an outer :func:`contained` or :func:`shown` already decides what happens to warnings."""


@contextmanager
def contained(tally: Tally | None = None) -> Iterator[None]:
    """Warnings raised inside are counted in ``tally`` (dropped without one), never raised or shown, whatever
    the filters around (``-W error`` included). Inside another :func:`contained` or :func:`shown`, the outer
    one decides: a backend's own containment then neither hides its warnings from the plugin's count nor from
    ``--ptn-upstream-logs``."""
    if _DECIDED.get():
        yield
        return
    token = _DECIDED.set(True)
    caught: list[tuple[str, str]] = []

    def note(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        caught.append((category.__name__, culprit(filename, sys._getframe(1))))

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = note
            try:
                yield
            finally:
                if tally is not None:
                    tally.record(caught)
    finally:
        _DECIDED.reset(token)


@contextmanager
def shown() -> Iterator[None]:
    """Warnings inside go to the caller's filters, even through a backend's :func:`contained`."""
    token = _DECIDED.set(True)
    try:
        yield
    finally:
        _DECIDED.reset(token)


@contextmanager
def policy(tally: Tally, show: bool) -> Iterator[None]:
    """Around what backends do: warnings counted in ``tally`` and upstream logs quiet, or (``show``) both let
    through."""
    if show:
        with shown():
            yield
    else:
        with contained(tally), quiet_logs():
            yield


def not_upstream_chatter(record: logging.LogRecord) -> bool:
    """A log filter: False for a DEBUG or INFO record of an upstream logger."""
    return record.levelno >= logging.WARNING or not any(
        record.name == name or record.name.startswith(f"{name}.") for name in UPSTREAM_LOGGERS
    )


@contextmanager
def quiet_logs() -> Iterator[None]:
    """Upstream DEBUG and INFO records reach none of the root logger's handlers while inside: pytest's
    captured and live logs and its log file (pytest also attaches these to non-propagating loggers,
    ``torch.__trace`` among them). Loggers' own levels and handlers are left as they are."""
    handlers = list(logging.getLogger().handlers)
    for handler in handlers:
        handler.addFilter(not_upstream_chatter)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(not_upstream_chatter)


def culprit(filename: str, frame: types.FrameType | None) -> str:
    """The package a warning is told as coming from: that of the file it is attributed to, unless that file
    is the standard library's (``copyreg`` re-creating an object whose class is deprecated), when it is the
    package of the code that called ``warn`` (``frame`` and out: the first frame outside the standard
    library), or of the class being created there when that is a ``__new__`` (a deprecation decorator's,
    ``typing_extensions.deprecated``, warns on behalf of the class it wraps)."""
    if not in_stdlib(filename):
        return package_of(filename)
    while frame is not None:
        code = frame.f_code
        if not in_stdlib(code.co_filename) and code.co_filename != __file__:
            created = frame.f_locals.get("cls") if code.co_name == "__new__" else None
            if isinstance(created, type):
                return created.__module__.split(".")[0]
            return package_of(code.co_filename)
        frame = frame.f_back
    return package_of(filename)


@functools.cache
def in_stdlib(filename: str) -> bool:
    """A file of the standard library (not of a package installed beside it), or one without a file."""
    if filename.startswith("<"):
        return True
    path = Path(filename)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return path.is_relative_to(stdlib) and "site-packages" not in path.parts


@functools.cache
def package_of(filename: str) -> str:
    """The top-level package (or module) a file belongs to: its first part below the deepest ``sys.path``
    entry holding it; the file's own name when none does."""
    path = Path(filename)
    roots = [Path(entry) for entry in sys.path if entry and path.is_relative_to(entry)]
    if not roots:
        return path.stem or filename
    deepest = max(roots, key=lambda root: len(root.parts))
    return path.relative_to(deepest).parts[0].removesuffix(".py")
