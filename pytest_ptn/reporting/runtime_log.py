"""What a runtime writes to stdout and stderr during a conformance test: one file per test, and each line
once in the failures.

ExecuTorch's C++ runtime logs through ``ET_LOG`` (to ``sys.stderr``, through its Python bindings), another
runtime's C++ to descriptor 2, and a runtime in another interpreter inherits that descriptor (its imports'
notices with it): pytest's capture put those lines in every failure's "Captured stderr", the same ones in
each (measured: 8 to 15 lines per failure, 7 of them in every one, on a runtime that serves each program
from a child process). Here what each phase of a conformance test writes to descriptors 1 and 2, and to
``sys.stdout`` and ``sys.stderr``, goes to the test's log instead (``--ptn-report DIR``:
``DIR/runtime-logs/``; else the run's temporary folder). A failure shows the lines no earlier failure
showed, counts the others, and names the whole log; log records stay in pytest's "Captured log". Only under
pytest's default ``--capture=fd``: with ``-s`` the output stays live.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import IO

import pytest

FOLDER = "runtime-logs"
"""The folder, in the report's or the run's temporary one, that holds each test's log."""
SECTION = "ptn runtime output (stdout and stderr)"
"""The title of a report's section (names with stdout and stderr, so ``--show-capture`` selects it)."""
SHOWN_LINES = 40
"""Lines of new output a failure shows at most; the rest is in its log."""
CLOCK = re.compile(r"^[IWEF]\d{4} |\d{2}:\d{2}:\d{2}(\.\d+)? *(\d+ )?")
"""A glog date and a time of day (with the pid glog writes after it): two lines differing only there are
the same line."""

PHASES = pytest.StashKey[list[tuple[str, str]]]()
"""A test's (phase, output) so far."""


def configure(config: pytest.Config) -> None:
    """Keep runtime output apart where pytest captures descriptors (``--capture=fd``, its default)."""
    if config.getoption("capture", None) != "fd":
        return
    report = config.getoption("ptn_report")
    folder = None if report is None else Path(report).resolve() / FOLDER
    if folder is not None and not hasattr(config, "workerinput"):
        shutil.rmtree(folder, ignore_errors=True)  # an earlier run's logs are not this one's
    config.pluginmanager.register(RuntimeLog(folder), "ptn-runtime-log")


def use_temporary_folder(config: pytest.Config, factory: pytest.TempPathFactory) -> None:
    """Without a report folder, the logs go to the run's temporary one (pytest keeps the last three runs')."""
    log = config.pluginmanager.get_plugin("ptn-runtime-log")
    if isinstance(log, RuntimeLog) and log.folder is None:
        log.folder = factory.mktemp(FOLDER, numbered=False)


class RuntimeLog:
    """The pytest side: each conformance test's phases written to its log, and its reports' sections."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.shown: dict[str, str] = {}
        """Each line a failure showed (its CLOCK left out) -> that failure's test."""

    @pytest.hookimpl(wrapper=True, trylast=True)  # inside pytest's own capture of the phase
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from self._phase(item, "setup"))

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from self._phase(item, "call"))

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from self._phase(item, "teardown"))

    def _phase(self, item: pytest.Item, when: str) -> Generator[None, None, None]:
        if "ptn_backend" not in getattr(item, "fixturenames", ()):
            return (yield)
        with tempfile.TemporaryFile() as spool:
            try:
                with descriptors_to(spool):
                    return (yield)
            finally:
                spool.seek(0)
                text = spool.read().decode(errors="replace")
                if text:
                    item.stash.setdefault(PHASES, []).append((when, text))
                    path = self.path(item)
                    if path is not None:
                        with path.open("a", encoding="utf-8") as log:
                            log.write(text if text.endswith("\n") else f"{text}\n")

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: the report's final outcome (a SHOULD xfailed)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        phases = item.stash.get(PHASES, [])
        if phases:
            report.sections.append((SECTION, self.section(item, phases, report.failed)))
        if report.when == "teardown":  # the test's last report: its output is in its log
            item.stash[PHASES] = []
        return report

    def path(self, item: pytest.Item) -> Path | None:
        if self.folder is None:
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        return self.folder / log_name(item.nodeid)

    def section(self, item: pytest.Item, phases: list[tuple[str, str]], failed: bool) -> str:
        """A failure's new lines, a count of the ones shown before, and where the whole log is; for a test
        that did not fail (pytest shows its sections with ``-rP``), where the whole log is."""
        lines = [line for _, text in phases for line in text.splitlines() if line.strip()]
        path = self.path(item)
        where = f"the whole log ({', '.join(when for when, _ in phases)}): {path}" if path else ""
        if not failed:
            return where or "\n".join(lines)
        new: list[str] = []
        earlier: dict[str, int] = {}
        again = 0
        for line in lines:
            key = CLOCK.sub("", line)
            if key in self.shown:
                test = self.shown[key]
                if test == item.nodeid:
                    again += 1
                else:
                    earlier[test] = earlier.get(test, 0) + 1
                continue
            self.shown[key] = item.nodeid
            new.append(line)
        out = new[:SHOWN_LINES]
        if len(new) > SHOWN_LINES:
            out.append(f"(+ {counted(len(new) - SHOWN_LINES)} more, in the whole log)")
        if again:
            out.append(f"(+ {counted(again)} repeated above)")
        out += [
            f"(+ {counted(n)} as shown for {test.rsplit('::', 1)[-1]} above)" for test, n in earlier.items()
        ]
        return "\n".join([*out, where] if where else out)


def counted(n: int) -> str:
    return f"{n} line{'s' if n != 1 else ''}"


def log_name(nodeid: str) -> str:
    """A file name for a test's log: its id with path separators and brackets made plain."""
    return re.sub(r"[^\w.@=+-]+", "_", nodeid).strip("_")[:200] + ".log"


@contextlib.contextmanager
def descriptors_to(spool: IO[bytes]) -> Iterator[None]:
    """Descriptors 1 and 2 (what C++ writes to stdout and stderr, and child processes that inherit them) go
    to ``spool`` while inside, and so do ``sys.stdout`` and ``sys.stderr``: executorch's Python bindings
    write ``ET_LOG`` lines through ``sys.stderr``. C's own buffers are flushed on the way in and out, so that
    a ``printf`` lands in the phase that made it."""
    flush_c_streams()
    saved = [os.dup(1), os.dup(2)]
    streams = sys.stdout, sys.stderr
    try:
        os.dup2(spool.fileno(), 1)
        os.dup2(spool.fileno(), 2)
        sys.stdout, sys.stderr = descriptor_writers()
        yield
    finally:
        flush_c_streams()
        sys.stdout, sys.stderr = streams
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


@functools.cache
def descriptor_writers() -> tuple[io.TextIOWrapper, io.TextIOWrapper]:
    """Text streams onto descriptors 1 and 2, made once and never closed: a logging handler made inside a
    phase keeps the stream it found, and writes through it to whatever the descriptor is then."""
    return writer(1), writer(2)


def writer(fd: int) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace", write_through=True)


def flush_c_streams() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    libc = c_library()
    if libc is not None:
        libc.fflush(None)


@functools.cache
def c_library() -> ctypes.CDLL | None:
    """The process's C library, None where there is none to find (not a POSIX system)."""
    try:
        return ctypes.CDLL(None)
    except (OSError, TypeError):
        return None
