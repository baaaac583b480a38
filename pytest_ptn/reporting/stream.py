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

A stream that cannot be written (a full disk) stops there, and is removed: the run goes on, its verdicts
reach pytest, and the reporter says, once, that its report is incomplete and why (``error``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
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


class VerdictStream:
    """The writing end, owned by the controller's reporter."""

    def __init__(self, path: Path, spec_version: str, provenance: dict[str, str], shard: str | None) -> None:
        self.path = path
        self.error: OSError | None = None
        """Why the stream stopped being written, if it did (it is gone then)."""
        self._fd: int | None = None
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        except OSError as e:
            self.error = e
        self._synced = time.monotonic()
        header = {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "spec_version": spec_version,
            "provenance": provenance,
            "shard": shard,
        }
        self._append(header, sync=True)

    def selected(self, count: int) -> None:
        self._append({"selected": count}, sync=True)

    def test(self, nodeid: str, rows: list[results.Result]) -> None:
        self._append({"test": nodeid, "rows": [asdict(r) for r in rows]})

    def end(self, run: results.RunStatus) -> None:
        self._append({"end": asdict(run)}, sync=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

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
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
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
