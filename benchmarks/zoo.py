"""What the zoo (upstream's models as scenarios, ``--ptn-zoo``) costs on each backend.

For every zoo model (pytest_ptn.programs.zoo) and backend, in a fresh process per backend: building the
scenario (upstream's model at tiny size, export of every method, the tags read from the functionalized
programs), then, as one conformance case does, exporting again, lowering, loading (the artifact and every
method) and running the call sequence compared with eager. Each figure is the best of ``--repeat`` (one case
of the suite pays each once; lowering is shared by a case's tests, loading and comparing are paid again by
most of them). ``--suite`` also times ``pytest conformance --ptn-zoo -m zoo`` for each backend, in process
(``-n 0``) from a fresh interpreter: the zoo's whole cost in a run.

aoti compiles (~15 s a method on 2 cores) go to ``$PTN_AOTI_CACHE``, by default a new temporary folder, so
its lowering column is a cold compile unless that variable points at a warm cache.

    python benchmarks/zoo.py [--quick] [--backends reference native pte aoti] [--models zoo_llama ...]
                             [--repeat 1] [--suite]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# This folder holds a packaging.py: put it after site-packages (see loader_sharing.py).
_HERE = Path(__file__).resolve().parent
sys.path = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]

from _common import ROOT, emit, machine, run_child, table  # noqa: E402

BACKENDS = ("reference", "native", "pte", "pte-shared-state", "aoti")


def measure(backend_name: str, models: list[str], repeat: int) -> dict[str, object]:
    """In this process: each model's build, then its export, lowering, loading and compared calls."""
    from pytest_ptn.backend import resolve_backend
    from pytest_ptn.harness import Case
    from pytest_ptn.programs import zoo

    backend = resolve_backend(backend_name)()
    rows: dict[str, dict[str, float | int | str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            start = time.perf_counter()
            scenario, _ = zoo.BY_NAME[name].scenario()
            row: dict[str, float | int | str] = {"build": time.perf_counter() - start}
            case = Case(backend, scenario, lambda step: Path(tempfile.mkdtemp(dir=tmp)))
            case.eager()
            best: dict[str, float] = {}
            for _ in range(repeat):
                times = {}
                start = time.perf_counter()
                programs = case.program.export()
                times["export"] = time.perf_counter() - start
                start = time.perf_counter()
                try:
                    lowered = backend.lower(programs, Path(tempfile.mkdtemp(dir=tmp)))
                except Exception as e:  # a backend that refuses the model: its figure is the refusal
                    row["mismatches"] = f"lowering refused ({type(e).__name__})"
                    times["lower"] = time.perf_counter() - start
                    best = {k: min(v, best.get(k, v)) for k, v in times.items()}
                    continue
                times["lower"] = time.perf_counter() - start
                start = time.perf_counter()
                loaded = backend.load(lowered)
                for method in case.program.method_names:
                    loaded.load_method(method)
                times["load"] = time.perf_counter() - start
                start = time.perf_counter()
                mismatches = case.run_sequence(loaded)
                times["compare"] = time.perf_counter() - start
                row["mismatches"] = f"{len({m.call for m in mismatches})} of {len(case.eager())} calls"
                best = {k: min(v, best.get(k, v)) for k, v in times.items()}
            rows[name] = {**row, **best}
    return {"backend": backend_name, "rows": rows}


def suite_seconds(backend: str) -> float:
    """Wall time of the zoo's conformance tests alone on ``backend``, in a fresh interpreter."""
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "conformance",
        f"--ptn-backend={backend}",
        "--ptn-zoo",
        "-m",
        "zoo",
    ]
    argv += ["-q", "-n", "0", "-p", "no:cacheprovider", "--ptn-no-expectations"]
    start = time.perf_counter()
    subprocess.run(
        argv, cwd=ROOT, capture_output=True, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    return time.perf_counter() - start


def main() -> None:
    from pytest_ptn.programs import zoo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS))
    parser.add_argument("--models", nargs="+", default=list(zoo.BY_NAME), choices=list(zoo.BY_NAME))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--suite", action="store_true", help="also time the zoo's conformance tests")
    parser.add_argument("--quick", action="store_true", help="reference only, the float32 models")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        emit(measure(args.child, args.models, args.repeat))
        return
    if args.quick:
        args.backends, args.models = ["reference"], [m.name for m in zoo.MODELS if m.dtype == "float32"]
    print(machine())
    os.environ.setdefault("PTN_AOTI_CACHE", tempfile.mkdtemp(prefix="ptn-zoo-aoti-"))
    print(f"aoti compile cache: {os.environ['PTN_AOTI_CACHE']}; best of {args.repeat}")
    rows, suites = [], []
    for backend in args.backends:
        result = run_child(
            [__file__, "--child", backend, "--repeat", str(args.repeat), "--models", *args.models],
            timeout=7200,
        )
        for name, r in result["rows"].items():  # type: ignore[attr-defined]
            cells = [
                f"{r[k]:.2f} s" if k in r else "-" for k in ("build", "export", "lower", "load", "compare")
            ]
            rows.append([backend, name, *cells, r.get("mismatches", "-")])
        if args.suite:
            suites.append([backend, f"{suite_seconds(backend):.1f} s"])
    headers = ["backend", "model", "build", "export", "lower", "load", "run + compare", "calls differing"]
    print(table(headers, rows))
    if suites:
        print()
        print(table(["backend", "pytest conformance --ptn-zoo -m zoo -n 0 (wall)"], suites))


if __name__ == "__main__":
    main()
