"""Programs per second of the fuzz strategies (issue 26), before and after in one run: the CI profile's
programs (``ptn-ci``: derandomized, the same programs every run) drawn and run through a backend with
``harness.check_spec``, in a fresh process per side and backend, paired (before, after, before, ...) as in
suite.py, with the share of methods whose decomposed form was reused (programs.exported.FunctionalForms).

Each child warms torch and the backend on one catalogue program first (imports, the first export), so the
rate is what a run pays per program, not what its first program pays once. ``--examples`` overrides the
profile's ``max_examples`` (a longer run shows the steady rate once the bounded graphs are all seen).

    python benchmarks/fuzz.py --baseline 63383ff [--backends reference,pte] [--examples 12] [--repeat 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]  # see packaging.py

from _common import machine, table  # noqa: E402
from suite import Tree, child_json, loadavg, trees  # noqa: E402

CHILD = """\
import json, sys, tempfile, time
from pathlib import Path
from hypothesis import given, settings
from pytest_ptn.backend import resolve_backend
from pytest_ptn.harness import check_spec
from pytest_ptn.programs import exported
try:
    from pytest_ptn.programs.export_forms import EXPORT_FORMS
except ImportError:  # a tree from before export forms: every method traced
    EXPORT_FORMS = None
from pytest_ptn.programs.catalogue import BY_NAME
from pytest_ptn.strategies import program_specs

backend = resolve_backend(sys.argv[1])()
counts = {"methods": 0, "decomposed": 0}
decompose, functional = exported.decompose, exported.FunctionalForms.functional

def counted_decompose(ep):
    counts["decomposed"] += 1
    return decompose(ep)

def counted_functional(self, ep):
    counts["methods"] += 1
    return functional(self, ep)

exported.decompose, exported.FunctionalForms.functional = counted_decompose, counted_functional

failures = []

def check(spec):
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mismatches = check_spec(backend, spec, Path(tmp))
        except BaseException as e:  # a lowering error fails (pytest.s Failed), a load or run error too
            mismatches = [f"{type(e).__name__}: {e}"]
    failures.extend(str(m)[:300] for m in mismatches[:1])
    return not mismatches

check(BY_NAME["single_method"].spec)  # warm: imports, the first export and lowering
counts.update(methods=0, decomposed=0)
if EXPORT_FORMS is not None:
    EXPORT_FORMS.exported = EXPORT_FORMS.reused = 0
failures.clear()
profile = settings.get_profile("ptn-ci")
examples = int(sys.argv[2]) or profile.max_examples
seconds, failed = [], [0]

@settings(profile, max_examples=examples)
@given(program_specs())
def run(spec):
    t0 = time.perf_counter()
    failed[0] += not check(spec)
    seconds.append(time.perf_counter() - t0)

t0 = time.perf_counter()
run()
print(json.dumps({"programs": len(seconds), "seconds": sum(seconds), "wall": time.perf_counter() - t0,
                  "failed": failed[0], **counts, "first_failure": failures[:1],
                  "exports_reused": EXPORT_FORMS.reused if EXPORT_FORMS is not None else 0,
                  "exports": EXPORT_FORMS.reused + EXPORT_FORMS.exported if EXPORT_FORMS is not None else 0}))
"""
"""Run in each tree's environment: its strategies, harness and backends."""


def measure(tree: Tree, backend: str, examples: int) -> dict[str, float]:
    load = loadavg()
    result = child_json(tree, f"fuzz on {backend}", CHILD, backend, str(examples))
    result["load"] = f"{load} -> {loadavg()}"
    rate = result["programs"] / result["seconds"]
    print(f"  {tree.side} {backend}: {rate:.2f}/s, {result}", file=sys.stderr, flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--baseline", metavar="REV", help="commit to compare against (default: this checkout only)"
    )
    ap.add_argument("--backends", default="reference,pte")
    ap.add_argument("--examples", type=int, default=0, help="programs per run (default: the profile's)")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    rows = []
    with trees(args.baseline) as found:
        print(f"machine: {machine()}", file=sys.stderr)
        for backend in args.backends.split(","):
            runs: dict[str, list[dict[str, float]]] = {t.side: [] for t in found}
            for _ in range(args.repeat):
                for tree in found:
                    runs[tree.side].append(measure(tree, backend, args.examples))
            for tree in found:
                best = max(runs[tree.side], key=lambda r: r["programs"] / r["seconds"])
                reused = 1 - best["decomposed"] / best["methods"] if best["methods"] else 0.0
                rows.append(
                    [
                        backend,
                        f"{tree.side} ({tree.commit})",
                        f"{best['programs']:.0f} ({best['failed']:.0f} failed)",
                        f"{best['seconds']:.1f} s",
                        f"{best['programs'] / best['seconds']:.2f}/s",
                        f"{reused:.0%} of {best['methods']:.0f}",
                        f"{best['exports_reused'] / best['exports']:.0%} of {best['exports']:.0f}"
                        if best.get("exports")
                        else "-",
                        "; ".join(str(r["load"]) for r in runs[tree.side]),
                    ]
                )
    print(f"machine: {machine()}\n")
    headers = [
        "backend",
        "side",
        "programs",
        "test cases",
        "programs/s (best)",
        "methods reusing a form",
        "reusing an export",
        "load",
    ]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
