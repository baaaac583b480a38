"""What the report costs a run, now that every test's verdict is streamed to DIR/verdicts.jsonl (issue 23).

The reference suite with ``--ptn-report DIR`` and without, in pairs (the order alternating, so a change in
the machine's load falls on both sides), plus the stream's own cost per test measured in-process.

    python benchmarks/report_stream.py [--quick] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, machine, table  # noqa: E402


def suite_run(selection: list[str], report: Path | None) -> float:
    """Wall seconds of one reference suite run in a fresh process (this checkout's code)."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "conformance",
        "--ptn-backend=reference",
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    cmd += selection + (["--ptn-report", str(report)] if report else [])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    return elapsed


def stream_cost(tests: int) -> tuple[float, int, float]:
    """Seconds to stream ``tests`` tests' rows (three rules each, like the suite's), the file's size, and
    the seconds of one fsync of a line (the stream pays at most one a second)."""
    from pytest_ptn.reporting import results, stream

    rows = [
        results.Result(rule, "MUST", "kv_cache", "reference", "pass", "", "pytest 'x'", None, "t::x")
        for rule in ("P1", "P2", "P3")
    ]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / stream.NAME
        start = time.perf_counter()
        writer = stream.VerdictStream(path, "1", {"torch": "2.13.0"}, None)
        writer.selected(tests)
        for n in range(tests):
            writer.test(f"t::x[{n}]", rows)
        writer.end(results.RunStatus(tests, tests))
        elapsed, size = time.perf_counter() - start, path.stat().st_size
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        start = time.perf_counter()
        for _ in range(20):
            os.write(fd, b"{}\n")
            os.fsync(fd)
        fsync = (time.perf_counter() - start) / 20
        os.close(fd)
        return elapsed, size, fsync


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="two scenarios instead of the whole suite")
    ap.add_argument("--repeat", type=int, default=3, help="pairs of runs (default 3)")
    args = ap.parse_args()
    selection = ["-k", "colliding_literals or kv_cache"] if args.quick else []
    print(machine())
    without: list[float] = []
    with_report: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            order = [False, True] if i % 2 == 0 else [True, False]
            for report in order:
                seconds = suite_run(selection, Path(tmp) / f"report{i}" if report else None)
                (with_report if report else without).append(seconds)
                print(
                    f"pair {i + 1}: {'with' if report else 'without'} --ptn-report {seconds:.1f} s",
                    flush=True,
                )
    ratios = [w / wo for w, wo in zip(with_report, without, strict=True)]
    stream_s, size, fsync_s = stream_cost(274)
    rows = [
        [
            "reference suite, best",
            f"{min(without):.1f} s",
            f"{min(with_report):.1f} s",
            f"{min(with_report) / min(without):.3f}",
        ],
        [
            "reference suite, median",
            f"{statistics.median(without):.1f} s",
            f"{statistics.median(with_report):.1f} s",
            f"{statistics.median(with_report) / statistics.median(without):.3f}",
        ],
        ["pairs (with/without)", "", "", ", ".join(f"{r:.3f}" for r in ratios)],
        ["stream alone, 274 tests", "", f"{stream_s * 1000:.1f} ms ({size} bytes)", ""],
        ["one fsync (at most 1/s)", "", f"{fsync_s * 1000:.2f} ms", ""],
    ]
    print(table(["row", "without --ptn-report", "with --ptn-report", "with/without"], rows))


if __name__ == "__main__":
    main()
