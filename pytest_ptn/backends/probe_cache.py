"""What a slow probe of this environment found, kept in the user's cache until what it depends on changes.

Whether an ``ext:`` flow lowers here is found by lowering a program through it (seconds to minutes: Core ML's
int8 recipe quantizes for 90 s), and ``list backends`` asks it of every flow whose delegate this runtime
lacks. The answer depends only on the installed software and on the executables on PATH (Arm's VGF flow
looks for its model converter there), so it is kept, one JSON file per probe, with that environment; any
change to it (a version, PATH, a file added to a folder on PATH) probes again.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path

from pytest_ptn.backend import package_version

CACHE_ENV = "PTN_PROBE_CACHE"
"""The folder the probes' results are kept in; ``~/.cache/pytest-ptn/probes`` by default."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "pytest-ptn" / "probes")


def environment(distributions: Iterable[str]) -> dict[str, str]:
    """What a probe's result depends on: the Python, each distribution's version, PATH, and each folder on
    PATH as last changed (an executable installed into one changes it)."""
    found = {"python": sys.version.split()[0], "PATH": os.environ.get("PATH", "")}
    for dist in distributions:
        found[dist] = package_version(dist) or "not installed"
    for folder in dict.fromkeys(found["PATH"].split(os.pathsep)):
        try:
            found[f"mtime {folder}"] = str(os.stat(folder).st_mtime_ns)
        except OSError:
            continue
    return found


_ANNOUNCE: ContextVar[Callable[[str], None] | None] = ContextVar("ptn_probe_announce", default=None)


@contextlib.contextmanager
def announced(to: Callable[[str], None]) -> Iterator[None]:
    """Inside, ``to(name)`` is called as a probe that was not kept starts: the slow step ``list backends``
    shows while it waits."""
    token = _ANNOUNCE.set(to)
    try:
        yield
    finally:
        _ANNOUNCE.reset(token)


def remembered(name: str, depends_on: dict[str, str], probe: Callable[[], str | None]) -> str | None:
    """``probe()``'s result as last found for ``name`` in the same environment (``depends_on``); else probed
    now and kept. A cache that cannot be read is probed past, one that cannot be written is left as it was."""
    path = cache_dir() / f"{name}.json"
    try:
        kept = json.loads(path.read_text())
        if kept["depends_on"] == depends_on:
            found: str | None = kept["found"]
            return found
    except (OSError, ValueError, KeyError, TypeError):
        pass
    announce = _ANNOUNCE.get()
    if announce is not None:
        announce(name)
    found = probe()
    with contextlib.suppress(OSError):
        _keep(path, {"depends_on": depends_on, "found": found})
    return found


def _keep(path: Path, record: dict[str, object]) -> None:
    """Written whole or not at all: two workers may probe at once, and a full disk leaves no half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}", suffix=".partial")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1)
        os.replace(partial, path)
    except BaseException:
        os.unlink(partial)
        raise
