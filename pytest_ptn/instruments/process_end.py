"""How a process ended without giving its answer, as values: a signal, an exit status, or no word at all.
The one describer of a process's end: failure text is its ``str``, a mechanism's key its ``key``, so a key
never comes from prose (a number, a node id or a guess such as "SIGKILL, or the out-of-memory killer")."""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass

FATAL_ERRORS = {
    "Segmentation fault": signal.SIGSEGV,
    "Aborted": signal.SIGABRT,
    "Bus error": signal.SIGBUS,
    "Floating-point exception": signal.SIGFPE,
    "Floating point exception": signal.SIGFPE,
    "Illegal instruction": signal.SIGILL,
}
"""faulthandler's "Fatal Python error: <words>" for each signal it reports (a worker's exit status may be lost
where xdist, not the test's process, saw it die)."""


class Ending(enum.StrEnum):
    """How a process ended."""

    SIGNAL = "signal"
    """Killed by a signal (its exit status, or faulthandler's report of a fatal one)."""
    STATUS = "status"
    """Exited with a status, before it answered."""
    NO_REPORT = "no report"
    """Gone, with neither an exit status nor a fatal-error report (os._exit in a worker, SIGKILL, the
    out-of-memory killer): nothing says which."""


@dataclass(frozen=True)
class ProcessEnd:
    """One process's end."""

    ending: Ending
    number: int | None = None
    """The signal's number or the exit status; for people, never part of a key."""
    words: str = ""
    """What the process reported of its end (faulthandler's "Segmentation fault"), or the signal's own
    description."""

    def __post_init__(self) -> None:  # read back from JSON, ``ending`` is its value
        object.__setattr__(self, "ending", Ending(self.ending))

    @classmethod
    def of(cls, returncode: int | None, fault: str = "") -> ProcessEnd:
        """From an exit status (negative: the signal, as subprocess gives it) and faulthandler's dump."""
        if returncode is not None and returncode < 0:
            try:
                return cls(Ending.SIGNAL, -returncode, signal.strsignal(-returncode) or "")
            except ValueError:
                return cls(Ending.SIGNAL, -returncode)
        for words, sig in FATAL_ERRORS.items():
            if f"Fatal Python error: {words}" in fault:
                return cls(Ending.SIGNAL, int(sig), words)
        if returncode is not None:
            return cls(Ending.STATUS, returncode)
        return cls(Ending.NO_REPORT)

    @property
    def signal_name(self) -> str | None:
        """``SIGSEGV``; None for an end by no signal, or by a number with no name."""
        if self.ending is not Ending.SIGNAL or self.number is None:
            return None
        try:
            return signal.Signals(self.number).name
        except ValueError:
            return None

    @property
    def key(self) -> str:
        """What stays the same from one such end to the next: the signal's name, ``signal`` for an unnamed
        one, ``status`` or ``no report``."""
        return self.signal_name or self.ending.value

    def __str__(self) -> str:
        if self.ending is Ending.SIGNAL:
            name = self.signal_name or f"signal {self.number}"
            return f"killed by {name} ({self.words})" if self.words else f"killed by {name}"
        if self.ending is Ending.STATUS:
            return f"exited with status {self.number}"
        return (
            "died without an exit status or a fatal-error report "
            "(os._exit, SIGKILL or the out-of-memory killer)"
        )
