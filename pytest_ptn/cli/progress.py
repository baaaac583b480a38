"""What ``list backends`` is doing while it works, on stderr; what upstream prints meanwhile, held back.

A cold ``list backends`` lowers a program through every ``ext:`` flow whose delegate this runtime lacks
(seconds to minutes each: Core ML's int8 recipe quantizes). On a terminal one line says what it is doing,
rewritten in place as pip's progress is, and cleared before the table; where stderr is a log, a plain line
names each slow probe as it starts, and a warm listing says nothing. What torch, executorch and torchao
print meanwhile (torchao's failed loads of its CUDA kernels, torch's pytree deprecations) is what a run
captures and does not show: held back here too, and written out only if the listing fails, to explain it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import TextIO

from pytest_ptn.backends.ext import flush_c_stdio


class Status:
    """The one line that says what is being done (on a terminal), or plain lines for slow steps (a log)."""

    def __init__(self, stream: TextIO | None):
        self.stream = stream
        self.live = stream is not None and stream.isatty()
        self.shown = False

    def update(self, text: str) -> None:
        """On a terminal, the line now says ``text``; elsewhere nothing (a log is not rewritten)."""
        if self.stream is None or not self.live:
            return
        width = shutil.get_terminal_size().columns - 1
        self.stream.write(f"\r{text[:width]}\x1b[K")
        self.stream.flush()
        self.shown = True

    def note(self, text: str) -> None:
        """A slow step starts: on a terminal the line says it, in a log it is a line of its own."""
        if self.stream is None:
            return
        if self.live:
            self.update(text)
            return
        self.stream.write(f"{text}\n")
        self.stream.flush()

    def clear(self) -> None:
        if self.stream is not None and self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


QUIET = Status(None)
"""For callers with nobody to tell (tests, ``list`` called as a library)."""


@contextlib.contextmanager
def held() -> Iterator[Status]:
    """Inside, what this process and the processes it starts write to stdout and stderr (file descriptors 1
    and 2: Python's streams, logging's handlers and native code alike) goes to a temporary file, written out
    to stderr if the block raises; the Status writes to the stderr there was, and is cleared on the way out.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    kept_out, kept_err = os.dup(1), os.dup(2)
    try:
        with tempfile.TemporaryFile() as hold, os.fdopen(os.dup(kept_err), "w") as stderr:
            status = Status(stderr)
            os.dup2(hold.fileno(), 1)
            os.dup2(hold.fileno(), 2)
            try:
                yield status
            except BaseException:
                _restore(kept_out, kept_err)
                status.clear()
                hold.seek(0)
                stderr.write(hold.read().decode(errors="replace"))
                stderr.flush()
                raise
            _restore(kept_out, kept_err)
            status.clear()
    finally:
        os.close(kept_out)
        os.close(kept_err)


def _restore(out: int, err: int) -> None:
    """File descriptors 1 and 2 as they were, once what was buffered for the held ones is written there."""
    sys.stdout.flush()
    sys.stderr.flush()
    flush_c_stdio()
    os.dup2(out, 1)
    os.dup2(err, 2)
