"""How far a long fuzz is while it runs: programs judged of its budget, one line per backend.

A nightly fuzz is one test per share that runs for minutes, and pytest shows nothing of a test until it
ends. Each share says how many programs it has judged (``Progress``): from an xdist worker as a file in the
run folder the controller shares with its workers, in an in-process run straight to the ``Board``. The
process that owns the terminal writes one line per backend, summed over its shares, at most every
``INTERVAL_S`` seconds and only when the count moved, so a fuzz shorter than that says nothing.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

INTERVAL_S = 30.0
"""Seconds between two progress lines: often enough to see a nightly move, rarely enough not to bury the
run's own lines (ptn-ci's fuzz on the reference backend ends before the first)."""
POLL_S = 1.0
"""How often the controller reads its workers' progress files."""
SUFFIX = ".fuzz-progress"


@dataclass(frozen=True)
class Progress:
    """One share of a backend's fuzz: ``done`` programs judged of its ``budget``."""

    backend: str
    share: str
    done: int
    budget: int


def write(folder: Path, progress: Progress) -> None:
    """A worker's side: its share's progress, replaced whole so the controller never reads half of it."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{progress.backend}-{progress.share}")
    path = folder / f"{name}{SUFFIX}"
    part = path.with_name(f"{path.name}.part")
    part.write_text(json.dumps(asdict(progress)))
    os.replace(part, path)


class Board:
    """What the terminal is told of the run's fuzz shares: a line per backend when one is due.

    ``folder``: where workers write their shares' progress (None: an in-process run, told by ``record``)."""

    def __init__(
        self,
        say: Callable[[str], None],
        folder: Path | None = None,
        interval: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.say = say
        self.folder = folder
        self.interval = interval
        self.clock = clock
        self.shares: dict[tuple[str, str], Progress] = {}
        self.shown: dict[str, tuple[int, int]] = {}
        self.since: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def record(self, progress: Progress) -> None:
        """A share's progress (in-process); a line goes out if one is due."""
        with self._lock:
            self.shares[(progress.backend, progress.share)] = progress
        self.tell()

    def read(self) -> None:
        """The workers' progress files (a file being replaced is read at the next poll)."""
        if self.folder is None:
            return
        for path in self.folder.glob(f"*{SUFFIX}"):
            try:
                progress = Progress(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                continue
            with self._lock:
                self.shares[(progress.backend, progress.share)] = progress

    def lines(self) -> list[str]:
        """A line per backend whose count moved since it was last shown."""
        totals: dict[str, list[int]] = {}
        with self._lock:
            for p in self.shares.values():
                done, budget, shares = totals.setdefault(p.backend, [0, 0, 0])
                totals[p.backend] = [done + p.done, budget + p.budget, shares + 1]
        out = []
        for backend, (done, budget, shares) in sorted(totals.items()):
            if self.shown.get(backend) == (done, budget):
                continue
            self.shown[backend] = (done, budget)
            spread = f", {shares} shares" if shares > 1 else ""
            out.append(f"ptn fuzz: {backend}: {done} of {budget} programs judged{spread}")
        return out

    def tell(self) -> None:
        """Say the lines that moved, if ``interval`` has passed since the last (or since the first share)."""
        now = self.clock()
        if not self.shares:
            return
        if self.since is None:
            self.since = now
        if now - self.since < self.interval:
            return
        lines = self.lines()
        for line in lines:
            self.say(line)
        if lines:
            self.since = now

    def watch(self) -> None:
        """Poll the folder in a thread of its own until ``close``."""

        def poll() -> None:
            while not self._stop.wait(POLL_S):
                self.read()
                self.tell()

        self._thread = threading.Thread(target=poll, name="ptn-fuzz-progress", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
