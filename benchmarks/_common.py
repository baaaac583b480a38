"""Helpers the benchmark scripts share: sizes, peak resident memory, child processes, one table."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GIB = 1 << 30
MIB = 1 << 20
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": MIB, "mib": MIB, "g": GIB, "gib": GIB}


def parse_size(text: str) -> int:
    """``1GiB``, ``256MiB``, ``4g``, ``1000`` -> bytes (binary units)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 1GiB, 256MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _status() -> dict[str, int]:
    text = Path("/proc/self/status").read_text()
    return {k: int(re.search(rf"^{k}:\s+(\d+) kB", text, re.M).group(1)) * 1024 for k in ("VmRSS", "VmHWM")}  # type: ignore[union-attr]


def reset_peak() -> int:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS and return that RSS: the baseline."""
    import gc

    gc.collect()
    with contextlib.suppress(OSError):  # no permission: VmHWM then also covers what came before
        Path("/proc/self/clear_refs").write_text("5")
    return _status()["VmRSS"]


def peak_rss() -> int:
    """Peak resident memory since the last ``reset_peak`` (VmHWM)."""
    return _status()["VmHWM"]


def rss() -> int:
    return _status()["VmRSS"]


def run_child(argv: Sequence[str], timeout: float = 3600) -> dict[str, object]:
    """Run ``python <argv>`` in a fresh process; its last stdout line is a JSON result."""
    proc = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"child {argv} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def emit(result: dict[str, object]) -> None:
    """A child's result, as the last line of its stdout."""
    print(json.dumps(result), flush=True)


def machine() -> str:
    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) * 1024  # type: ignore[union-attr]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} cores ({model}), {fmt_bytes(mem)} RAM, Python {platform.python_version()}, "
        f"load average {load} at start (other work running: timings are best of N)"
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table, columns padded to line up in a terminal too."""
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"

    return "\n".join(
        [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells[1:])]
    )
