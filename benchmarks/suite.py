"""Conformance-suite benchmark: wall time of the installed suite as a user runs it, in an empty folder.

- ``reference`` serially and with ``-n 2`` (pytest-xdist): best of ``--repeat``, and the speed-up;
- ``aoti`` (``pytest_ptn/backends/aoti/``, when it imports and a C++ compiler exists), whose lowering is
  cached on disk: a first run on an empty ``$PTN_AOTI_CACHE`` and a second (warm) run on the same cache,
  with ``--aoti-workers`` xdist workers (default 2; compiling is the slow part).

Each run is ``python -m pytest --ptn-backend=NAME -p no:cacheprovider [-n N]`` in a fresh temp folder, timed
with ``time.perf_counter`` around the subprocess (interpreter start and collection included).

    python benchmarks/suite.py [--quick] [--repeat 3] [--no-aoti]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]  # see packaging.py

from _common import machine, table  # noqa: E402

QUICK_SELECTION = ["-m", "P6 or P7 or P8 or X1"]
"""--quick: the rejection tests only (a handful of lowerings)."""


@dataclass
class Run:
    seconds: float
    rc: int
    summary: str


def run_suite(backend: str, workers: int, extra: list[str], env: dict[str, str] | None = None) -> Run:
    args = [sys.executable, "-m", "pytest", f"--ptn-backend={backend}", "-p", "no:cacheprovider", "-q"]
    if workers > 1:
        args += ["-n", str(workers)]
    with tempfile.TemporaryDirectory(prefix="ptn-suite-") as folder:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [*args, *extra], cwd=folder, capture_output=True, text=True, env=env, check=False
        )
        seconds = time.perf_counter() - t0
    lines = [
        ln for ln in proc.stdout.splitlines() if re.search(r"\b(passed|failed|error|errors)\b.* in ", ln)
    ]
    summary = re.sub(r"\s+in [0-9.]+s.*$", "", lines[-1].strip("= ")) if lines else f"exit {proc.returncode}"
    if proc.returncode not in (0, 1):
        tail = (proc.stdout + proc.stderr)[-2000:]
        print(f"  pytest exited {proc.returncode}:\n{tail}", file=sys.stderr)
    print(f"  {backend} -n {workers}: {seconds:.1f} s, {summary}", file=sys.stderr, flush=True)
    return Run(seconds, proc.returncode, summary)


def aoti_spec() -> str | None:
    """How to name the aoti backend on the command line, or None (with the reason printed) if unusable."""
    try:
        from importlib.metadata import entry_points

        from pytest_ptn.backends.aoti.backend import AotiBackend
    except Exception as exc:  # another engineer's work in progress: any failure means "not usable"
        print(f"aoti: pytest_ptn.backends.aoti.backend does not import ({exc})", file=sys.stderr)
        return None
    avail = AotiBackend.availability()
    if not avail.available:
        print(f"aoti: unavailable ({avail.reason})", file=sys.stderr)
        return None
    installed = {ep.name for ep in entry_points(group="pytest_ptn.backends")}
    return "aoti" if "aoti" in installed else "pytest_ptn.backends.aoti.backend:AotiBackend"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"only {' '.join(QUICK_SELECTION)}, once, no aoti")
    ap.add_argument("--repeat", type=int, default=None, help="runs per reference row (default 3; quick 1)")
    ap.add_argument("--no-aoti", action="store_true")
    ap.add_argument("--aoti-workers", type=int, default=2)
    args = ap.parse_args()
    extra = QUICK_SELECTION if args.quick else []
    repeat = args.repeat or (1 if args.quick else 3)

    rows: list[list[str]] = []
    serial = [run_suite("reference", 1, extra) for _ in range(repeat)]
    parallel = [run_suite("reference", 2, extra) for _ in range(repeat)]
    best_serial = min(r.seconds for r in serial)
    best_parallel = min(r.seconds for r in parallel)
    for name, runs, speedup in (
        ("reference, serial", serial, ""),
        ("reference, -n 2", parallel, f"{best_serial / best_parallel:.2f}x vs serial"),
    ):
        rows.append(
            [
                name,
                f"{min(r.seconds for r in runs):.1f}",
                ", ".join(f"{r.seconds:.1f}" for r in runs),
                runs[0].summary,
                speedup,
            ]
        )

    note = ""
    spec = None if args.quick or args.no_aoti else aoti_spec()
    if spec is None:
        note = "aoti rows skipped: " + (
            "--quick / --no-aoti" if args.quick or args.no_aoti else "see the reason above"
        )
    else:
        with tempfile.TemporaryDirectory(prefix="ptn-aoti-cache-") as cache:
            env = {**os.environ, "PTN_AOTI_CACHE": cache}
            cold = run_suite(spec, args.aoti_workers, extra, env)
            warm = run_suite(spec, args.aoti_workers, extra, env)
        label = f"aoti, -n {args.aoti_workers}"
        rows.append([f"{label}, first run (empty cache)", f"{cold.seconds:.1f}", "1 run", cold.summary, ""])
        rows.append(
            [
                f"{label}, second run (warm cache)",
                f"{warm.seconds:.1f}",
                "1 run",
                warm.summary,
                f"{cold.seconds / warm.seconds:.2f}x vs first",
            ]
        )

    selection = " ".join(extra) if extra else "the whole installed suite"
    print(
        f"conformance suite: python -m pytest --ptn-backend=NAME -p no:cacheprovider -q in an empty temp "
        f"folder ({selection}); best of {repeat} per reference row\nmachine: {machine()}\n"
    )
    print(table(["run", "wall s (best)", "all runs s", "result", "speed-up"], rows))
    if note:
        print(f"\n{note}")


if __name__ == "__main__":
    main()
