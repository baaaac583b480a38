"""Which deliberately broken reference variants (tests/broken_backends.py) the fuzz test alone catches.

Runs ``conformance/test_fuzz.py`` on each variant with a fuzz profile (default ptn-ci, derandomized: the
same programs every run) in its own process and prints one line per variant, ``caught`` or ``missed``, then
the caught list. Run it on two commits to show a change of the strategies did not make the fuzzer blind.

    python benchmarks/fuzz_catches.py [--profile ptn-ci] [--root TREE]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def variants(root: Path) -> dict[str, str]:
    """rule -> class name of its broken variant, as the tree at ``root`` defines them."""
    code = (
        "import json, broken_backends as b; print(json.dumps({r: c.__name__ for r, c in b.BROKEN.items()}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env_for(root), capture_output=True, text=True, check=True
    )
    import json

    return dict(sorted(json.loads(out.stdout.splitlines()[-1]).items()))


def env_for(root: Path) -> dict[str, str]:
    extra = os.environ.get("PYTHONPATH", "")  # a sitecustomize shim pointing the editable install at root
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), str(root / "tests"), extra])),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="ptn-ci")
    ap.add_argument("--root", type=Path, default=ROOT, help="the tree to run (default: this checkout)")
    ap.add_argument("--rules", help="comma-separated rules whose variants to run (default: all)")
    args = ap.parse_args()
    caught = []
    for rule, name in variants(args.root).items():
        if args.rules and rule not in args.rules.split(","):
            continue
        t0 = time.perf_counter()
        # a private basetemp: concurrent pytest runs of one user prune each other's default one
        basetemp = tempfile.mkdtemp(prefix="ptn-fuzz-catches-")
        proc = subprocess.run(
            [
                sys.executable, "-m", "pytest", str(args.root / "conformance" / "test_fuzz.py"),
                f"--ptn-backend=broken_backends:{name}", f"--ptn-fuzz-profile={args.profile}",
                "--ptn-no-expectations", "-p", "no:cacheprovider", "-q", "-n", "0", f"--basetemp={basetemp}",
            ],
            cwd=args.root, env=env_for(args.root), capture_output=True, text=True, check=False,
        )  # fmt: skip
        shutil.rmtree(basetemp, ignore_errors=True)
        outcome = "caught" if re.search(r"\b1 failed\b", proc.stdout) else "missed"
        if outcome == "caught":
            caught.append(rule)
        why = next((ln.strip() for ln in proc.stdout.splitlines() if ln.startswith(("FAILED", "E "))), "")
        print(f"{rule:4} {name:22} {outcome} ({time.perf_counter() - t0:.1f} s) {why[:150]}", flush=True)
    print("caught:", " ".join(caught))


if __name__ == "__main__":
    main()
