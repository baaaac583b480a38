"""Runs that stop early: SIGTERM stops a conformance run as Ctrl-C does, and the words for why a run stopped.

CI time limits and Kubernetes send SIGTERM, whose default action ends the process at once: no report, no
summary. Here the first SIGTERM raises `Stopped` (a KeyboardInterrupt, so neither a test's nor a backend's
``except Exception`` swallows it) wherever the controller is, pytest ends the session as for Ctrl-C and the
reports say what stopped it. A second SIGTERM, like a second Ctrl-C, ends the process at once.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

import pytest

STOP_SIGNALS = (signal.SIGTERM,)


class Stopped(KeyboardInterrupt):
    """A run stopped by a signal (SIGTERM), as pytest handles a Ctrl-C."""

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signal}")


def _stop(signum: int, frame: FrameType | None) -> None:
    signal.signal(signum, signal.SIG_DFL)  # the next one ends the process at once
    raise Stopped(signum)


class StopOnSignal:
    """Installs the handler for the run (main thread only) and puts back what was there after it."""

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}

    def pytest_configure(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, _stop) for s in STOP_SIGNALS}

    def pytest_unconfigure(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def configure(config: pytest.Config, conformance: bool) -> None:
    """On the controller of a conformance run: a host's own test runs keep their signal handling."""
    if conformance and not hasattr(config, "workerinput"):
        config.pluginmanager.register(StopOnSignal(), "ptn-stop-on-signal")  # its pytest_configure runs now


def reason(exc: BaseException) -> str:
    """Why a session that ended with this exception stopped, for the reports' incomplete headline."""
    if isinstance(exc, Stopped):
        return str(exc)
    if isinstance(exc, pytest.exit.Exception):
        return f"stopped by pytest.exit: {exc.msg}"
    if type(exc) is KeyboardInterrupt:
        return "interrupted (SIGINT, Ctrl-C)"
    return (
        str(exc) or type(exc).__name__
    )  # xdist: "stopping after 1 failures", "... received keyboard-interrupt"
