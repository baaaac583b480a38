"""``DIR/verdicts.jsonl``: every finished test's rows, appended the moment it finishes.

A run's finished verdicts are data, whatever ends the run: a CI time limit's SIGTERM, a cancel's SIGINT, or a
SIGKILL (the OOM killer, a lost node) that runs no Python at all. Each test's rows are one line written with
one ``write`` to an append-only file, so they are in the kernel's page cache, which survives the process,
before the next test's report is handled; ``fsync`` (which only a lost machine needs) runs at most once a
second, so the stream costs a write per test. ``python -m pytest_ptn report render DIR`` turns what a run
left into results.json, summary.md and index.html, marked incomplete unless the run wrote its end line.

Lines, each one JSON object: a header (``schema``, ``version``, ``spec_version``, ``provenance``, ``shard``),
``{"selected": M}`` once the selection is known, ``{"test": NODEID, "rows": [...]}`` per finished test (a
later line for the same test replaces an earlier one), and ``{"end": RUN}`` (results.json's ``run``) when
the run finished its reports. A last line cut short by a kill is ignored.

A folder is one run's: the stream's file is locked (``flock``, released however the run ends, a SIGKILL
too) from the plugin's start to the run's end, and a second run given the folder meanwhile is refused,
naming the first from its header's ``writer`` (``claim``); it neither empties the folder nor mixes its
verdicts into the first run's.

A stream that cannot be written (a full disk) stops there, and is removed: the run goes on, its verdicts
reach pytest, and the reporter says, once, that its report is incomplete and why (``error``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pytest_ptn.reporting import results

NAME = "verdicts.jsonl"
SCHEMA = "pytest-ptn/verdicts"
SCHEMA_VERSION = 1
FSYNC_INTERVAL_S = 1.0

KILLED = (
    "the run ended without finishing its report (killed: SIGKILL, out of memory, a lost machine?); "
    f"rendered from {NAME}"
)


class InUse(Exception):
    """Another run, still going, writes this stream; the message names it."""


def claim(path: Path) -> int:
    """The stream's file, open and locked for this run, as the other run left it (emptied once the run
    starts). InUse if a run that is still going holds it; OSError if it cannot be opened."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise InUse(f"in use by another run, {writer_of(path)}") from None
    return fd


def writer_of(path: Path) -> str:
    """The run that writes ``path``, in words, from its header."""
    try:
        with path.open(encoding="utf-8") as f:
            header = json.loads(f.readline())
        writer, started = header["writer"], header["provenance"]["time"]
        return f"pid {writer['pid']} on {writer['host']}, started {started}: {writer['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "which has not written its header yet"


class VerdictStream:
    """The writing end, owned by the controller's reporter; ``fd``: the file as ``claim`` gave it (claimed
    now when not given)."""

    def __init__(
        self,
        path: Path,
        spec_version: str,
        provenance: dict[str, str],
        shard: str | None,
        fd: int | None = None,
    ) -> None:
        self.path = path
        self.error: OSError | None = None
        """Why the stream stopped being written, if it did (it is gone then)."""
        self._fd: int | None = fd
        try:
            if self._fd is None:
                self._fd = claim(path)
            if os.fstat(self._fd).st_size:  # an earlier run's stream
                os.ftruncate(self._fd, 0)
        except OSError as e:
            self._stop(e)
        self._synced = time.monotonic()
        header = {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "spec_version": spec_version,
            "provenance": provenance,
            "shard": shard,
            "writer": {"pid": os.getpid(), "host": socket.gethostname(), "command": shlex.join(sys.argv)},
        }
        self._append(header, sync=True)

    def close(self) -> None:
        """Let the file go (and the folder with it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def selected(self, count: int) -> None:
        self._append({"selected": count}, sync=True)

    def test(self, nodeid: str, rows: list[results.Result]) -> None:
        self._append({"test": nodeid, "rows": [asdict(r) for r in rows]})

    def end(self, run: results.RunStatus) -> None:
        self._append({"end": asdict(run)}, sync=True)
        self.close()

    def _append(self, line: dict[str, Any], sync: bool = False) -> None:
        if self._fd is None:
            return
        data = (json.dumps(line, ensure_ascii=False) + "\n").encode()
        try:
            if os.write(self._fd, data) < len(data):  # the disk filled up mid-line
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            now = time.monotonic()
            if sync or now - self._synced >= FSYNC_INTERVAL_S:
                os.fsync(self._fd)
                self._synced = now
        except OSError as e:
            self._stop(e)

    def _stop(self, error: OSError) -> None:
        """The stream cannot be written: it goes (a partial stream would read as a run killed midway)."""
        self.error = error
        self.close()
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)


def read(path: Path) -> results.Results:
    """The results a stream holds: the run's own status if it ended, else incomplete (killed)."""
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise results.ResultsFormatError(f"{path}: not UTF-8 text: {exc}") from exc
    entries = []
    for number, line in enumerate(lines, 1):
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number < len(lines):  # only the last line can be one a kill cut short
                raise results.ResultsFormatError(f"{path}:{number}: not JSON: {exc}") from exc
    if not entries or not isinstance(entries[0], dict) or entries[0].get("schema") != SCHEMA:
        raise results.ResultsFormatError(f"{path}: not a {SCHEMA} stream")
    header = entries[0]
    if header.get("version") != SCHEMA_VERSION:
        raise results.ResultsFormatError(
            f"{path}: {SCHEMA} version {header.get('version')!r} is not supported"
        )
    selected: int | None = None
    rows: dict[str, list[Any]] = {}
    run: results.RunStatus | None = None
    for number, entry in enumerate(entries[1:], 2):
        if not isinstance(entry, dict):
            raise results.ResultsFormatError(f"{path}:{number}: not an object")
        if "test" in entry:
            rows[str(entry["test"])] = list(entry.get("rows", []))
        elif "selected" in entry:
            selected = entry["selected"]
        elif "end" in entry:
            run = results.run_status(entry["end"])
    if run is None:
        run = results.RunStatus(selected, len(rows), KILLED, header.get("shard"))
    document = {
        "schema": results.SCHEMA,
        "version": results.SCHEMA_VERSION,
        "spec_version": header.get("spec_version"),
        "provenance": header.get("provenance"),
        "results": [row for test in rows.values() for row in test],
        "run": asdict(run),
    }
    try:
        return results.from_dict(document)
    except results.ResultsFormatError as exc:
        raise results.ResultsFormatError(f"{path}: {exc}") from exc
