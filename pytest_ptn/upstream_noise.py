"""What torch, executorch and torchao say while a backend lowers, loads and runs is never a verdict.

Upstream toolchains warn (deprecations, a notice per mutated buffer) and log (``torch.__trace`` logs at DEBUG
whatever the host's level). In a repository whose pytest configuration has ``filterwarnings = error`` or
``log_level = DEBUG``, an upstream deprecation would fail a valid program, and a failure would come
buried under hundreds of empty records. So inside :func:`contained` warnings are counted (in a
:class:`Tally`), never raised or shown, and inside :func:`quiet_logs` upstream loggers' DEBUG and INFO
records reach no handler. :func:`shown` lets both through, for ``--ptn-upstream-logs``.

A warning is told as raised where the code that raised it is, never where the suite called a backend
(:func:`author`): a backend's ``warn(..., stacklevel=2)`` blames its caller, which is pytest-ptn's harness
or its conformance tests, and a finalizer that warns (a subprocess still running) runs wherever the suite
happened to let the backend's object go.

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
from typing import NamedTuple, TextIO

SHOW_OPTION = "--ptn-upstream-logs"
"""The pytest option under which upstream warnings and logs go through to pytest as usual."""

UPSTREAM_LOGGERS = ("torch", "executorch", "torchao")
"""Loggers (with their children) whose records below WARNING are upstream chatter."""

PACKAGE = Path(__file__).resolve().parent
"""pytest-ptn's package: its plugin, its harness, and its conformance tests once installed."""
CHECKOUT_SUITE = PACKAGE.parent / "conformance"
"""The conformance tests in a checkout (an editable install maps ``pytest_ptn.conformance`` there)."""
RUNNERS = ("_pytest", "pluggy")
"""The packages of the test runner that calls the suite."""

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
def contained(tally: Tally | None = None, owner: str | None = None) -> Iterator[None]:
    """Warnings raised inside are counted in ``tally`` (dropped without one) under their :func:`author`,
    never raised or shown, whatever the filters around (``-W error`` included); ``owner``: the package of the
    backend at work inside. Inside another :func:`contained` or :func:`shown`, the outer one decides: a
    backend's own containment then neither hides its warnings from the plugin's count nor from
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
        caught.append(
            (category.__name__, author(filename, lineno, sys._getframe(1), category, owner).package)
        )

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
    """Warnings inside go to the caller's filters, even through a backend's :func:`contained`, and are shown
    at their :func:`author`'s line (pytest's warnings summary, say)."""
    token = _DECIDED.set(True)
    show = warnings.showwarning

    def at_author(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        told = author(filename, lineno, sys._getframe(1), category)
        moved = (told.filename, told.lineno) != (filename, lineno)
        show(message, category, told.filename, told.lineno, file, None if moved else line)

    warnings.showwarning = at_author
    try:
        yield
    finally:
        warnings.showwarning = show
        _DECIDED.reset(token)


@contextmanager
def policy(tally: Tally, show: bool, owner: str | None = None) -> Iterator[None]:
    """Around what the backend of package ``owner`` does: warnings counted in ``tally`` and upstream logs
    quiet, or (``show``) both let through."""
    if show:
        with shown():
            yield
    else:
        with contained(tally, owner), quiet_logs():
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


class Author(NamedTuple):
    """Where a warning is told as raised, and the package whose code raised it."""

    filename: str
    lineno: int
    package: str


def author(
    filename: str,
    lineno: int,
    frame: types.FrameType | None,
    category: type[Warning],
    owner: str | None = None,
) -> Author:
    """Who raised a warning that Python attributes to ``filename:lineno``. ``frame``: one of the warning's
    stack, from ``warn``'s caller outward (the standard library's frames inside ``warn`` are passed over).

    - Attributed to code outside the suite (:func:`in_harness`) and the standard library: that code.
    - To the standard library (``copyreg`` re-creating an object whose class is deprecated): the code that
      called it (the first frame outside the standard library), or the class created there when that is a
      ``__new__`` (a deprecation decorator's, ``typing_extensions.deprecated``, warns on behalf of the class
      it wraps).
    - To the suite, by a stack level that blames the caller of a backend's code (a ``load_pte`` that warns
      with ``stacklevel=2``, a deprecated helper of the adapter): the outermost frame of the code the suite
      called. Upstream's frames (torch, executorch, torchao) are passed over: their stack levels rightly
      blame their caller, one of pytest-ptn's own backends.
    - By a finalizer (a ``__del__``, or a ResourceWarning: a subprocess still running, a file left open)
      as the suite let go of what a backend made: that backend's package, ``owner``.
    """
    inside, outer = _below_harness(frame)
    code = [f for f in inside if not in_stdlib(f.f_code.co_filename) and f.f_code.co_filename != __file__]
    if not in_stdlib(filename) and not in_harness(filename):
        return Author(filename, lineno, package_of(filename))
    if in_stdlib(filename) and code:
        created = code[0].f_locals.get("cls") if code[0].f_code.co_name == "__new__" else None
        if isinstance(created, type):
            return Author(filename, lineno, created.__module__.split(".")[0])
        return Author(filename, lineno, package_of(code[0].f_code.co_filename))
    called = [f for f in code if package_of(f.f_code.co_filename) not in UPSTREAM_LOGGERS]
    if called and not in_stdlib(filename):
        outermost = called[-1].f_code.co_filename
        return Author(outermost, called[-1].f_lineno or 0, package_of(outermost))
    finalizer = issubclass(category, ResourceWarning) or any(f.f_code.co_name == "__del__" for f in inside)
    if finalizer and owner is not None and owner != PACKAGE.name:
        return Author(filename, lineno, owner)
    if in_stdlib(filename) and outer is not None:
        return Author(filename, lineno, package_of(outer.f_code.co_filename))
    return Author(filename, lineno, package_of(filename))


def _below_harness(frame: types.FrameType | None) -> tuple[list[types.FrameType], types.FrameType | None]:
    """The frames from ``frame`` outward up to the suite's first (:func:`in_harness`), and that one (None
    when the stack holds none)."""
    inside: list[types.FrameType] = []
    while frame is not None:
        name = frame.f_code.co_filename
        if name != __file__ and in_harness(name):
            return inside, frame
        inside.append(frame)
        frame = frame.f_back
    return inside, None


@functools.cache
def in_stdlib(filename: str) -> bool:
    """A file of the standard library (not of a package installed beside it), or one without a file."""
    if filename.startswith("<"):
        return True
    path = Path(filename)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return path.is_relative_to(stdlib) and "site-packages" not in path.parts


@functools.cache
def in_harness(filename: str) -> bool:
    """A file of the suite that calls backends: pytest-ptn's, its checkout's conformance tests, pytest's."""
    path = Path(filename)
    return (
        path.is_relative_to(PACKAGE) or path.is_relative_to(CHECKOUT_SUITE) or package_of(filename) in RUNNERS
    )


@functools.cache
def package_of(filename: str) -> str:
    """The top-level package (or module) a file belongs to: pytest-ptn for its own files and its checkout's
    conformance tests (an editable install puts neither below a ``sys.path`` entry); else its first part
    below the deepest ``sys.path`` entry holding it; the file's own name when none does."""
    path = Path(filename)
    if path.is_relative_to(PACKAGE) or path.is_relative_to(CHECKOUT_SUITE):
        return PACKAGE.name
    roots = [Path(entry) for entry in sys.path if entry and path.is_relative_to(entry)]
    if not roots:
        return path.stem or filename
    deepest = max(roots, key=lambda root: len(root.parts))
    return path.relative_to(deepest).parts[0].removesuffix(".py")
