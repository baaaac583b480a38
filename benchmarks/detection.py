"""The suite's detection power (issue 57): which realistic broken backends (tests/defect_corpus.py) each mode
of the suite kills, with what mechanisms, and the mutation score (killed / total) per mode.

Modes (``--modes``), each a pytest run of its own per member, in an empty temporary folder (no example
database: a nightly run is the seed's alone), with ``--ptn-no-expectations -n 0``:

- ``suite``: the scenario suite, ``pytest conformance --ptn-backend=defect_corpus:<Class> -k "not fuzz"``;
  killed when a MUST test fails (a SHOULD rule's failure is reported, not fatal, so it kills nothing);
- ``ci``: the fuzz under CI's profile, ``-k fuzz --ptn-fuzz-profile=ptn-ci`` (12 derandomized programs);
- ``nightly``: ``-k fuzz --ptn-fuzz-profile=ptn-nightly --ptn-seed=7`` (400 random programs, a failure
  shrunk: minutes per member that it catches; ``--nightly-missed`` runs it only where the other modes missed).

Per member and mode it prints the failed tests (the fuzz: the programs drawn up to and including the first
failing one, from hypothesis's observability records), the mechanisms the failures carry (results.json,
``pytest_ptn.mechanisms.PROPERTY``) and whether one is of a kind the member records; then the mutation score
per mode, killed and killed with the member's kind. ``--jobs`` runs that many members at once.

    python benchmarks/detection.py [--members BindsByKey,MetadataOnly] [--modes suite,ci] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]  # see packaging.py

from _common import ROOT, table  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))

from defect_corpus import CORPUS, Defect  # noqa: E402

from pytest_ptn.reporting.results import FAIL, load  # noqa: E402

MODES = {
    "suite": ["-k", "not fuzz"],
    "ci": ["-k", "fuzz", "--ptn-fuzz-profile=ptn-ci"],
    "nightly": ["-k", "fuzz", "--ptn-fuzz-profile=ptn-nightly"],
}
FUZZ_MODES = ("ci", "nightly")
OBSERVE = {"HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY_NOCOVER": "1"}
"""hypothesis then writes a JSON line per test case under ``$HYPOTHESIS_STORAGE_DIRECTORY/observed/``
(benchmarks/suite.py reads them too): the order the programs were drawn and which failed."""


@dataclass
class Outcome:
    """One mode's run on one member."""

    failed: int = 0
    """Failed MUST tests (suite); for a fuzz mode, 1 if its test failed."""
    drawn: int | None = None
    """Fuzz: programs drawn up to and including the first failing one (all drawn where none failed)."""
    programs: int = 0
    """Fuzz: programs judged (the tally's count; under ptn-nightly, the shrink's programs included)."""
    mechanisms: Counter[str] = field(default_factory=Counter)
    """Mechanism key -> failed tests that carry it."""
    tally: Counter[str] = field(default_factory=Counter)
    """Fuzz: mechanism key -> programs that showed it (pytest_ptn.fuzzing.tally)."""
    right_kind: bool = False
    """A failure carries a mechanism of a kind the member records."""
    seconds: float = 0.0
    broken: str = ""
    """Why the run gave no results (an error of the run itself), else empty."""

    def cell(self, mode: str) -> str:
        if self.broken:
            return f"RUN FAILED: {self.broken}"
        if mode in FUZZ_MODES:
            judged = f"{self.programs} programs judged"
            said = f"caught at program {self.drawn}, {judged}" if self.failed else f"missed, {judged}"
        else:
            said = f"caught ({self.failed} failed)" if self.failed else "missed"
        return f"{said}, {self.seconds:.0f} s"


def run_mode(defect: Defect, mode: str, seed: int, keep: Path | None) -> Outcome:
    """Run ``mode`` on ``defect`` in a fresh folder and read what it found; its report (``--ptn-report``)
    goes to ``keep``/<member>-<mode> where given."""
    args = [*MODES[mode], *([f"--ptn-seed={seed}"] if mode == "nightly" else [])]
    with tempfile.TemporaryDirectory(prefix="ptn-detection-") as tmp:
        work = Path(tmp)
        report = keep / f"{defect.backend.__name__}-{mode}" if keep else work / "report"
        env = {
            **os.environ,
            **OBSERVE,
            "HYPOTHESIS_STORAGE_DIRECTORY": str(work / "hypothesis"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")])),
        }
        command = [
            sys.executable, "-m", "pytest", str(ROOT / "conformance"), defect.option, *args,
            "--ptn-no-expectations", "-p", "no:cacheprovider", "-q", "-n", "0",
            f"--ptn-report={report}", f"--basetemp={work / 'tmp'}",
        ]  # fmt: skip
        t0 = time.perf_counter()
        proc = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, check=False)
        outcome = Outcome(seconds=time.perf_counter() - t0)
        results = report / "results.json"
        if proc.returncode not in (0, 1) or not results.exists():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
            outcome.broken = f"exit {proc.returncode}: {' | '.join(tail)}"[:300]
            return outcome
        kinds = {k.value for k in defect.kinds}
        failed: dict[str, set[str]] = {}
        for result in load(results).results:
            if result.outcome != FAIL:
                continue
            keys = failed.setdefault(result.nodeid, set())
            keys.update(m.key for m in result.mechanisms)
            outcome.right_kind |= any(m.kind.value in kinds for m in result.mechanisms)
            if result.fuzz is not None:
                outcome.programs += result.fuzz.programs
                outcome.tally.update({k: s.programs for k, s in result.fuzz.mechanisms.items()})
        outcome.failed = len(failed)
        outcome.mechanisms = Counter(key for keys in failed.values() for key in keys)
        if mode in FUZZ_MODES:
            outcome.drawn = drawn_until_failure(work / "hypothesis")
    return outcome


def drawn_until_failure(storage: Path) -> int:
    """Programs drawn up to and including the first that failed (all of them where none failed): hypothesis's
    generate phase (ptn-nightly) or the fixed sequence's draws (ptn-ci, ``fuzz_one_input``: no phase), never
    a replay from the database, a shrink or a draw hypothesis rejected."""
    drawn = 0
    for path in sorted(storage.glob("observed/*testcases.jsonl")):
        for line in path.read_text().splitlines():
            case = json.loads(line)
            phase = case.get("metadata", {}).get("phase")
            if phase not in ("generate", None) or case.get("status") in ("gave_up", None):
                continue
            drawn += 1
            if case["status"] == "failed":
                return drawn
    return drawn


def run_member(
    defect: Defect, modes: list[str], seed: int, nightly_missed: bool, keep: Path | None
) -> dict[str, Outcome]:
    outcomes: dict[str, Outcome] = {}
    for mode in modes:
        if mode == "nightly" and nightly_missed and any(o.failed for o in outcomes.values()):
            continue
        outcomes[mode] = run_mode(defect, mode, seed, keep)
        print(f"{defect.backend.__name__} {mode}: {outcomes[mode].cell(mode)}", file=sys.stderr, flush=True)
    return outcomes


def mechanisms_cell(outcome: Outcome | None, defect: Defect) -> str:
    """The failures' mechanisms (tests per key; the fuzz: programs per key, from its tally, and what its test
    failed as where that is not among them), then NOT and the member's kinds where none is of them."""
    if outcome is None or not outcome.failed:
        return ""
    counts = outcome.tally or outcome.mechanisms
    shown = ", ".join(f"{key} x{n}" for key, n in counts.most_common()) or "none"
    if other := sorted(set(outcome.mechanisms) - set(counts)):
        shown += f"; the test failed as {', '.join(other)}"
    return shown if outcome.right_kind else f"{shown} (NOT {'/'.join(sorted(defect.kinds))})"


def load_average() -> str:
    """The load averages: other work on a shared machine slows every mode's seconds."""
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", help="comma-separated class names of corpus members (default: all)")
    ap.add_argument("--modes", default="suite,ci,nightly", help="comma-separated of: " + ", ".join(MODES))
    ap.add_argument("--seed", type=int, default=7, help="--ptn-seed of the nightly mode (default 7)")
    ap.add_argument(
        "--nightly-missed", action="store_true", help="run nightly only on members the other modes missed"
    )
    ap.add_argument("--jobs", type=int, default=1, help="members run at once (default 1)")
    ap.add_argument("--keep", type=Path, help="keep each run's report (--ptn-report) in KEEP/<member>-<mode>")
    args = ap.parse_args()
    modes = [m for m in MODES if m in args.modes.split(",")]
    if unknown := set(args.modes.split(",")) - set(MODES):
        ap.error(f"unknown modes {sorted(unknown)} (of {', '.join(MODES)})")
    names = args.members.split(",") if args.members else [d.backend.__name__ for d in CORPUS]
    by_class = {d.backend.__name__: d for d in CORPUS}
    if unknown := set(names) - set(by_class):
        ap.error(f"not in the corpus: {sorted(unknown)} (has {', '.join(by_class)})")
    members = [by_class[n] for n in names]
    print(f"{os.cpu_count()} cores, load average {load_average()} at start", file=sys.stderr, flush=True)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        member = partial(
            run_member, modes=modes, seed=args.seed, nightly_missed=args.nightly_missed, keep=args.keep
        )
        runs = list(pool.map(member, members))
    headers = ["member", "kinds"]
    for mode in modes:
        headers += [mode, f"{mode} mechanisms"]
    rows = []
    for defect, outcomes in zip(members, runs, strict=True):
        row = [f"{defect.backend.__name__} ({defect.name})", "/".join(sorted(defect.kinds))]
        for mode in modes:
            outcome = outcomes.get(mode)
            row += [outcome.cell(mode) if outcome else "not run", mechanisms_cell(outcome, defect)]
        rows.append(row)
    print(table(headers, rows))
    scores = []
    for mode in modes:
        ran = [o[mode] for o in runs if mode in o]
        killed = sum(bool(o.failed) for o in ran)
        right = sum(o.right_kind for o in ran)
        scores.append(f"{mode} {killed}/{len(ran)} ({right}/{len(ran)} with the member's kind)")
    if {"suite", "ci"} <= set(modes):
        either = sum(bool(o["suite"].failed or o["ci"].failed) for o in runs)
        scores.append(f"suite or ci {either}/{len(runs)}")
    print("mutation score (killed/total): " + "; ".join(scores))
    print(f"load average {load_average()} at the end", file=sys.stderr)


if __name__ == "__main__":
    main()
