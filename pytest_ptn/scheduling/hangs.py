"""A backend step that never returns fails its test, never the run.

A deadlocked compiler or GPU driver (one hung ``cudaDeviceSynchronize``) neither returns nor crashes: without
a limit the run makes no progress until CI kills it, and a nightly job loses its night. In a crash-isolated
worker (pytest_ptn.scheduling.crashes) each backend step of a case (lowering it, loading a method, one call,
one fuzz example) re-arms faulthandler's watchdog; a step that makes no progress for ``--ptn-timeout``
seconds has every thread's Python stack written to the run folder by the watchdog's own thread (it needs no
GIL, so a step stuck in C++ holding it is caught too) and its worker ended. From there it is a crash: the
controller fails the test naming the hang and the step, xdist replaces the worker, and later tests of the
case that reach the same step fail at once.

A call into the backend before its first case (its ``__init__``, ``availability()``, ``load_runtime()``) is a
step too: a worker hung in one is ended the same way, and the controller ends the run as the usage error it
is, naming the call, with the stacks. The controller asks ``availability()`` itself, for the run header,
before any worker starts: that call is limited by a SIGALRM (``limited``), which reaches a call holding the
GIL as long as it waits in a system call; one that holds it spinning in C is ended by faulthandler's
watchdog soon after, its stacks written (exit status 1: nothing else runs in that process).

In-process runs (``-n 0``, ``--pdb``) have no limit: ending the process would end the run, or the debugging
session, itself; the run header says so.
"""

from __future__ import annotations

import contextlib
import faulthandler
import math
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from types import FrameType
from typing import IO

import pytest

OPTION = "--ptn-timeout"
INI = "ptn_timeout"

DEFAULT_LIMIT = 600.0
"""Seconds one step may make no progress by default. The slowest steps the suite has are lowerings: a cold
AOTInductor compile (empty pytest-ptn and inductor caches) of the catalogue's largest scenario,
``eight_methods``, took 18 s on 2 cores at load 1, of the zoo's largest 23 s (``zoo_voxtral_bf16``), and
68-84 s a zoo model at load 7.5; executorch's own lowering of a zoo model took up to 59 s at that load
(benchmarks/README.md). 600 s is ten times the slowest of them, room for a slower machine or a CUDA
toolchain's compile, so only a step that is not coming back reaches it; and a hung step costs a nightly
job ten minutes, not its night."""

TIMEOUT_DUMP = re.compile(r"^Timeout \(\d+:\d\d:\d\d(?:\.\d+)?\)!", re.M)
"""How faulthandler's watchdog opens the dump it writes when a limit passes (``Timeout (0:10:00)!``)."""


def add_options(parser: pytest.Parser, group: pytest.OptionGroup) -> None:
    group.addoption(
        OPTION,
        type=float,
        default=None,
        metavar="SECONDS",
        dest="ptn_timeout",
        help=f"the longest one backend step (lowering a case, loading a method, one call, one fuzz example) "
        f"may make no progress before its test fails as hung, with every thread's stack, and its xdist "
        f"worker is replaced (default {DEFAULT_LIMIT:g}, above any cold compile of the suite; 0 or inf: "
        f"no limit). "
        f"In-process runs (-n 0, --pdb) have no limit",
    )
    parser.addini(INI, f"the default of {OPTION} (seconds)", default=None)


def limit(config: pytest.Config) -> float:
    """The run's limit in seconds (0: none), from the option, else the ini, else the default. inf, and a
    limit longer than the watchdog's clock can count (``threading.TIMEOUT_MAX``, some 292 years), are no
    limit: no step of a run reaches them, and faulthandler refuses to arm them."""
    given = config.getoption("ptn_timeout", None)
    source = OPTION
    if given is None:
        ini = config.getini(INI)
        source = f"{INI} (ini)"
        try:
            given = DEFAULT_LIMIT if ini in (None, "") else float(ini)
        except ValueError:
            raise pytest.UsageError(f"{source}: {ini!r} is not a number of seconds") from None
    if not given >= 0:  # NaN too
        raise pytest.UsageError(f"{source}: {given:g} is not a number of seconds >= 0 (0: no limit)")
    if math.isinf(given) or given * (1 + Watchdog.SLACK) > threading.TIMEOUT_MAX:
        return 0.0
    return float(given)


def no_progress(seconds: float) -> str:
    """The words a hang is told in: ``no progress for 600 s``."""
    return f"no progress for {seconds:g} s"


def is_timeout_dump(fault: str) -> bool:
    """Whether a dead worker's faulthandler file holds the watchdog's dump: the worker hung, not crashed."""
    return TIMEOUT_DUMP.search(fault) is not None


class Watchdog:
    """faulthandler's watchdog for one worker: every thread's stack into ``file`` and the process ended
    (exit status 1) once ``seconds`` pass without ``progress()``; 0 seconds: never.

    Re-arming starts a new watchdog thread (about 0.1 ms), and a run has thousands of steps, most of them
    milliseconds apart; so the watchdog is armed for ``seconds`` plus a slack of one percent and re-armed
    only once that slack has run down: it fires between ``seconds`` and ``1.01 * seconds`` after the last
    progress, never sooner."""

    SLACK = 0.01

    def __init__(self, seconds: float, file: IO[str]):
        self.seconds = seconds
        self.file = file
        self.armed_at: float | None = None

    def progress(self) -> None:
        """A step starts: the clock starts again."""
        if self.seconds <= 0:
            return
        now = time.monotonic()
        slack = self.seconds * self.SLACK
        if self.armed_at is not None and now - self.armed_at < slack:
            return  # the deadline armed then is still at least ``seconds`` away
        faulthandler.dump_traceback_later(self.seconds + slack, repeat=False, file=self.file, exit=True)
        self.armed_at = now

    def idle(self) -> None:
        """No step is running (between tests, while the worker waits for work): no clock."""
        if self.armed_at is not None:
            faulthandler.cancel_dump_traceback_later()
            self.armed_at = None


class HungCall(BaseException):
    """A call into the backend in the controller made no progress within the limit; the message names it,
    with every thread's stack. A BaseException, so that the backend's own ``except Exception`` lets it by."""


STDERR = 2
"""The descriptor the backstop writes the stacks to (sys.stderr may be a capture with none)."""

BACKSTOP = 5.0
"""Seconds after a limited call's limit at which faulthandler's watchdog ends the process, should the
SIGALRM never reach Python (a call spinning in C with the GIL held)."""


@contextlib.contextmanager
def limited(seconds: float, what: str) -> Iterator[None]:
    """``what`` (a call into the backend, in this process's main thread) raises HungCall once it has made no
    progress for ``seconds`` (0: no limit)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(signum: int, frame: FrameType | None) -> None:
        raise HungCall(
            f"{what} made {no_progress(seconds)}; every thread (most recent call last):\n{stacks()}"
        )

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds + BACKSTOP, repeat=False, file=STDERR, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()


def stacks() -> str:
    """Every thread's Python stack, as a traceback reads."""
    frames = sys._current_frames()
    return "\n".join(
        f"thread {t.name!r}:\n{''.join(traceback.format_stack(frames[t.ident]))}"
        for t in threading.enumerate()
        if t.ident in frames
    )
