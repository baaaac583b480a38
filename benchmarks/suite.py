"""Speed goals of issue 17, before and after in one run: each row times the same command on a baseline commit
(checked out in a temporary ``git worktree``) and on this checkout, runs paired (before, after, before,
after, ...) so that the load of a shared machine falls on both sides alike.

Rows (``--rows``; commands run with this interpreter, in an empty temp folder unless said otherwise):

- ``aoti``: ``python -m pytest --ptn-backend=aoti -p no:cacheprovider -q -n 2`` on empty ``$PTN_AOTI_CACHE``
  and ``$TORCHINDUCTOR_CACHE_DIR`` (cold; goal after/before <= 1/3, same outcomes), then again on the same
  caches (warm; goal warm/cold <= 1/5 on the after side). About 6 min cold, 1.5 min warm at f399677.
- ``tests``: the project's own ``python -m pytest -n 2 -p no:cacheprovider -q`` in the tree's root (goal
  <= 1/2). About 8 min per side at f399677.
- ``reference``: ``python -m pytest --ptn-backend=reference -p no:cacheprovider -q``, best of ``--repeat``
  (goal <= 0.6). About 70 s a run at f399677.
- ``fuzz``: ``-k fuzz --ptn-fuzz-profile=ptn-ci`` on the reference backend (its 12 derandomized programs,
  the same on both sides); programs per second = programs hypothesis generated and ran / seconds of those
  test cases, from its observability records (goal >= 10/s after). About 20 s a side at f399677.
- ``load``: ``python -m pytest --help`` with the plugin and with ``-p no:ptn``, best of 10 each (goal: the
  difference <= 50 ms after).
- ``pte``: ``python -m pytest --ptn-backend=pte -n 2 -k "not in_bf16 and not in_fp16"`` (the float32
  scenarios), best of ``--repeat`` (issue 32's goal: after/before <= 1.05, its methods lowered alone where a
  case fails included). About 70 s a run idle.
- ``openvino``: ``python -m pytest --ptn-backend=openvino -n 2``, best of ``--repeat`` (goal <= 1.5).

A tree is run as ``PYTHONPATH=<tree root>`` plus a ``sitecustomize`` pointing the venv's editable install of
pytest-ptn (whose ``pytest_ptn.conformance`` maps to a folder outside ``pytest_ptn/``) at that tree; each
tree's child is asked where ``pytest_ptn``, its plugin and its suite come from before anything is timed.
Without ``--baseline`` only this checkout is run (no ratios). A full run with a baseline takes about an
hour on 2 cores; ``--quick`` (small selections, one run each) about 4 min.

    python benchmarks/suite.py --baseline f399677 [--quick] [--rows aoti,tests] [--no-aoti] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]  # see packaging.py

from _common import ROOT, machine, table  # noqa: E402

ROWS = ("aoti", "tests", "reference", "fuzz", "load", "pte", "openvino")
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
FLOAT32 = ["-k", "not in_bf16 and not in_fp16"]
FULL = {
    "aoti": ["-q"],
    "tests": ["-q"],
    "reference": ["-q"],
    "fuzz": ["-q", "-k", "fuzz", "--ptn-fuzz-profile=ptn-ci"],
    "pte": ["-q", "-n", "2", *FLOAT32],
    "openvino": ["-q", "-n", "2"],
}
QUICK = {
    "aoti": ["-q", "-k", "single_method or colliding_literals"],
    "tests": ["-q", "tests/test_rules.py", "tests/test_cli.py"],
    "reference": ["-q", "-m", "P6 or P7 or P8 or X1"],
    "fuzz": ["-q", "-k", "fuzz", "--ptn-fuzz-profile=ptn-ci", "--ptn-seed=1"],
    "pte": ["-q", "-n", "2", "-k", "kv_cache or colliding_literals"],
    "openvino": ["-q", "-n", "2", "-k", "kv_cache or torchao_int8_weights"],
}
"""--quick: a few scenarios, two test files, the rejection tests, the CI fuzz profile (12 programs)."""

PROBE = """\
import importlib.util, json, pytest_ptn, pytest_ptn.plugin
suite = importlib.util.find_spec("pytest_ptn.conformance")
print(json.dumps({"pytest_ptn": pytest_ptn.__file__, "plugin": pytest_ptn.plugin.__file__,
                  "conformance": list(suite.submodule_search_locations) if suite else []}))
"""
"""Run in each tree's environment: where the code a timed run would use comes from."""


@dataclass(frozen=True)
class Tree:
    side: str
    root: Path
    commit: str
    env: dict[str, str]


@dataclass
class Run:
    seconds: float
    summary: str
    output: str
    load: str


@dataclass
class Row:
    name: str
    before: str
    after: str
    ratio: str
    goal: str
    result: str
    notes: list[str] = field(default_factory=list)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def git(*args: str, cwd: Path = ROOT) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"git {' '.join(args)} failed:\n{proc.stderr}")
    return proc.stdout.strip()


def describe_commit(root: Path) -> str:
    dirty = git("status", "--porcelain", "--untracked-files=no", cwd=root)
    return git("rev-parse", "--short", "HEAD", cwd=root) + ("+uncommitted changes" if dirty else "")


def editable_finder() -> tuple[str, dict[str, str]]:
    """The venv's editable-install finder of pytest-ptn (imported by its ``.pth`` at start-up) and its
    mapping of package names to folders of this checkout."""
    for name, module in sys.modules.items():
        mapping = getattr(module, "MAPPING", None)
        if name.startswith("__editable___pytest_ptn") and isinstance(mapping, dict):
            return name, mapping
    raise SystemExit("pytest-ptn is not installed editable in this interpreter: cannot point it at a tree")


def tree_env(root: Path, shim: Path) -> dict[str, str]:
    """Environment whose ``import pytest_ptn`` and ``pytest_ptn.conformance`` resolve inside ``root``:
    ``PYTHONPATH`` alone finds ``root/pytest_ptn`` but leaves the suite to the editable finder, which maps
    it to the installed checkout's ``conformance/`` (this one, or another worktree's), so a
    ``sitecustomize`` remaps the finder too."""
    finder, mapping = editable_finder()
    installed = Path(mapping["pytest_ptn"]).parent
    remapped = {name: str(root / Path(path).relative_to(installed)) for name, path in mapping.items()}
    shim.mkdir(parents=True)
    (shim / "sitecustomize.py").write_text(
        f'"""Written by benchmarks/suite.py: the editable install of pytest-ptn points at {root}."""\n'
        "import sys\n\n"
        f"sys.modules[{finder!r}].MAPPING.update({remapped!r})\n"
    )
    path = os.pathsep.join(filter(None, [str(root), str(shim), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def child_json(tree: Tree, what: str, code: str, *args: str) -> dict:
    """The JSON line a ``python -c code args`` child in ``tree``'s environment prints last. It runs from an
    empty folder: ``-c`` puts the working directory first on sys.path, which made a child import the
    checkout this script was started in instead of ``tree``. A failing child ends the script, its output
    and ``what`` it was said."""
    with tempfile.TemporaryDirectory(prefix="ptn-child-") as empty:
        proc = subprocess.run(
            [sys.executable, "-c", code, *args],
            cwd=empty,
            env=tree.env,
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode:
        raise SystemExit(
            f"{tree.side} ({tree.root}) {what}: exit {proc.returncode}\n"
            f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    result: dict = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def check_tree(tree: Tree) -> None:
    """Fail unless a child in ``tree``'s environment imports pytest_ptn, its plugin and its suite from
    ``tree``."""
    where = child_json(tree, "probe", PROBE)
    paths = [where["pytest_ptn"], where["plugin"], *where["conformance"]]
    print(f"{tree.side} ({tree.commit}) imports {', '.join(paths)}", file=sys.stderr)
    outside = [p for p in paths if not Path(p).resolve().is_relative_to(tree.root.resolve())]
    if outside or not where["conformance"]:
        raise SystemExit(f"{tree.side}: NOT INSIDE {tree.root}: {outside or 'no pytest_ptn.conformance'}")


@contextmanager
def trees(baseline: str | None) -> Iterator[list[Tree]]:
    """The baseline (a detached worktree at ``baseline``, removed on the way out, Ctrl-C included) when
    asked for, then this checkout."""
    with tempfile.TemporaryDirectory(prefix="ptn-bench-trees-") as tmp:
        work = Path(tmp, "baseline")
        found = []
        try:
            if baseline:
                git("worktree", "add", "--detach", str(work), baseline)
                # bytecode now, as the checkout already has it, not in the first timed run
                subprocess.run([sys.executable, "-m", "compileall", "-q", str(work)], check=True)
                env = tree_env(work, Path(tmp, "shim-before"))
                found.append(Tree("before", work, describe_commit(work), env))
            found.append(Tree("after", ROOT, describe_commit(ROOT), tree_env(ROOT, Path(tmp, "shim-after"))))
            for tree in found:
                check_tree(tree)
            yield found
        finally:
            if work.exists():
                subprocess.run(["git", "worktree", "remove", "--force", str(work)], cwd=ROOT, check=False)
                subprocess.run(["git", "worktree", "prune"], cwd=ROOT, check=False)


def summary_of(stdout: str, rc: int) -> str:
    """pytest's last line (``3 passed, 1 xfailed``) without its time."""
    words = r"\b(passed|failed|errors?|skipped|deselected|xfailed|xpassed|no tests ran)\b"
    lines = [ln for ln in stdout.splitlines() if re.search(words + r".* in [0-9.]+s", ln)]
    return re.sub(r"\s+in [0-9.]+s.*$", "", lines[-1].strip("= ")) if lines else f"exit {rc}"


def run_pytest(
    tree: Tree, args: Sequence[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> Run:
    """``python -m pytest -p no:cacheprovider ARGS`` in ``tree``'s environment, in ``cwd`` or an empty temp
    folder, timed around the subprocess (interpreter start and collection included)."""
    with tempfile.TemporaryDirectory(prefix="ptn-suite-") as empty:
        load = loadavg()
        t0 = time.perf_counter()
        proc = subprocess.run(
            [*PYTEST, *args],
            cwd=cwd or empty,
            env={**tree.env, **(env or {})},
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.perf_counter() - t0
    output = proc.stdout + proc.stderr
    if proc.returncode not in (0, 1):
        print(f"  {tree.side}: pytest exited {proc.returncode}:\n{output[-2000:]}", file=sys.stderr)
    summary = summary_of(proc.stdout, proc.returncode)
    run = Run(seconds, summary, output, f"{load} -> {loadavg()}")
    print(f"  {tree.side}: {seconds:.1f} s, {summary}, load {run.load}", file=sys.stderr, flush=True)
    return run


def paired(trees: list[Tree], repeat: int, measure: Callable[[Tree], Run]) -> dict[str, list[Run]]:
    """``measure`` on each tree in turn for ``repeat`` rounds: before, after, before, after, ..."""
    runs: dict[str, list[Run]] = {t.side: [] for t in trees}
    for _ in range(repeat):
        for tree in trees:
            runs[tree.side].append(measure(tree))
    return runs


def fmt(value: float | None, unit: str = "", digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def verdict(ok: bool | None) -> str:
    return "n/a (no baseline)" if ok is None else ("PASS" if ok else "MISS")


def over(after: float, before: float | None) -> float | None:
    return None if before is None else after / before


def outcomes_of(runs: dict[str, list[Run]]) -> dict[str, str]:
    return {side: " | ".join(sorted({r.summary for r in side_runs})) for side, side_runs in runs.items()}


def differ_flag(runs: dict[str, list[Run]]) -> str:
    return ", OUTCOMES DIFFER" if len(set(outcomes_of(runs).values())) > 1 else ""


def wall_row(name: str, trees: list[Tree], runs: dict[str, list[Run]], max_ratio: float) -> Row:
    """Best wall time per side, goal after/before <= ``max_ratio``, and the outcomes, which must agree."""
    best = {side: min(r.seconds for r in side_runs) for side, side_runs in runs.items()}
    ratio = over(best["after"], best.get("before"))
    outcomes = outcomes_of(runs)
    result = verdict(None if ratio is None else ratio <= max_ratio) + differ_flag(runs)
    before = fmt(best.get("before"), " s", 1)
    row = Row(name, before, fmt(best["after"], " s", 1), fmt(ratio), f"<= {max_ratio:.2f}", result)
    for tree in trees:
        times = ", ".join(f"{r.seconds:.1f}" for r in runs[tree.side])
        loads = "; ".join(r.load for r in runs[tree.side])
        row.notes.append(f"{tree.side} ({tree.commit}): {times} s; {outcomes[tree.side]}; load {loads}")
    if differ_flag(runs):
        row.notes.append("!!! OUTCOMES DIFFER between before and after: not the same runs timed !!!")
    return row


def aoti_rows(trees: list[Tree], spec: str, workers: int, selection: list[str]) -> list[Row]:
    """Cold, then warm on the same caches; each side has its own caches, empty before its cold run."""
    args = [f"--ptn-backend={spec}", "-n", str(workers), *selection]
    with tempfile.TemporaryDirectory(prefix="ptn-aoti-caches-") as tmp:
        caches: dict[str, dict[str, str]] = {}
        for tree in trees:
            caches[tree.side] = {
                "PTN_AOTI_CACHE": str(Path(tmp, tree.side, "ptn")),
                "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp, tree.side, "inductor")),
            }
            for folder in caches[tree.side].values():
                Path(folder).mkdir(parents=True)
        print("aoti, cold:", file=sys.stderr)
        cold = paired(trees, 1, lambda tree: run_pytest(tree, args, env=caches[tree.side]))
        print("aoti, warm:", file=sys.stderr)
        warm = paired(trees, 1, lambda tree: run_pytest(tree, args, env=caches[tree.side]))
    command = "pytest " + " ".join(args)
    cold_row = wall_row(f"aoti suite -n {workers}, cold (empty caches)", trees, cold, 1 / 3)
    cold_row.notes.insert(0, f"{command}, PTN_AOTI_CACHE and TORCHINDUCTOR_CACHE_DIR empty")
    warm_row = wall_row(f"aoti suite -n {workers}, warm (same caches)", trees, warm, 1 / 5)
    warm_over_cold = {side: warm[side][0].seconds / cold[side][0].seconds for side in cold}
    warm_row.goal = "warm/cold <= 0.20 (after)"
    warm_row.result = verdict(warm_over_cold["after"] <= 1 / 5) + differ_flag(warm)
    warm_row.notes.insert(0, "warm/cold: " + ", ".join(f"{s} {v:.2f}" for s, v in warm_over_cold.items()))
    return [cold_row, warm_row]


def tests_row(trees: list[Tree], selection: list[str]) -> Row:
    args = ["-n", "2", *selection]
    print("project tests:", file=sys.stderr)
    row = wall_row(
        "project tests -n 2", trees, paired(trees, 1, lambda t: run_pytest(t, args, cwd=t.root)), 1 / 2
    )
    row.notes.insert(0, "pytest " + " ".join(args) + " in the tree's root")
    return row


def reference_row(trees: list[Tree], selection: list[str], repeat: int) -> Row:
    args = ["--ptn-backend=reference", *selection]
    print("reference suite, serial:", file=sys.stderr)
    runs = paired(trees, repeat, lambda t: run_pytest(t, args))
    row = wall_row(f"reference suite serial, best of {repeat}", trees, runs, 0.6)
    row.notes.insert(0, "pytest " + " ".join(args))
    return row


BACKEND_GOALS = {"pte": 1.05, "openvino": 1.5}
"""The conformance runs of a real backend timed as a whole, and the after/before each may cost."""


def backend_row(trees: list[Tree], spec: str, selection: list[str], repeat: int) -> Row:
    """A real backend's conformance run, best of ``repeat`` per side. Its outcomes may differ between the
    sides where the after side checks more (a new rule's tests): the row says so, and the time is the
    whole run's, what a user waits for."""
    args = [f"--ptn-backend={spec}", *selection]
    print(f"{spec} suite:", file=sys.stderr)
    runs = paired(trees, repeat, lambda t: run_pytest(t, args))
    row = wall_row(f"{spec} suite, best of {repeat}", trees, runs, BACKEND_GOALS[spec])
    row.notes.insert(0, "pytest " + " ".join(args))
    return row


OBSERVE = {"HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY_NOCOVER": "1"}
"""hypothesis then writes a JSON line per test case (not its coverage, which would slow the run) under
``$HYPOTHESIS_STORAGE_DIRECTORY/observed/``. ``--hypothesis-show-statistics`` prints nothing for the fuzz
test: hypothesis's pytest plugin collects statistics only for a test that is itself ``@given``, and the
fuzz test runs an inner one."""


def generate_phase(storage: Path) -> tuple[int, int, float]:
    """Programs run (passing and failing) in hypothesis's generate phase, draws it rejected, and the seconds
    its test cases took (drawing and running a program; hypothesis's own bookkeeping between cases aside)."""
    programs = invalid = 0
    seconds = 0.0
    for path in storage.glob("observed/*testcases.jsonl"):
        for line in path.read_text().splitlines():
            case = json.loads(line)
            if case.get("type") != "test_case" or case.get("metadata", {}).get("phase") != "generate":
                continue
            if case["status"] == "gave_up":
                invalid += 1
            else:
                programs += 1
            seconds += sum(v for k, v in case["timing"].items() if k.startswith(("execute:", "generate:")))
    return programs, invalid, seconds


def max_examples(tree: Tree, profile: str) -> int:
    code = (
        "import pytest_ptn.strategies\nfrom hypothesis import settings\n"
        f"print(settings.get_profile({profile!r}).max_examples)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=tree.env, capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


def fuzz_row(trees: list[Tree], selection: list[str]) -> Row:
    """Programs per second of the fuzz test on the reference backend: programs hypothesis generated and ran
    / the seconds those test cases took, from hypothesis's observability records."""
    args = ["--ptn-backend=reference", *selection]
    profile = next(a.split("=", 1)[1] for a in selection if a.startswith("--ptn-fuzz-profile="))
    rates: dict[str, float] = {}
    notes = [f"{' '.join(f'{k}={v}' for k, v in OBSERVE.items())} pytest {' '.join(args)}"]
    fallback = False
    print("fuzz, reference:", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="ptn-fuzz-") as tmp:
        storage = {t.side: Path(tmp, t.side) for t in trees}
        runs = paired(
            trees,
            1,
            lambda t: run_pytest(
                t, args, env={**OBSERVE, "HYPOTHESIS_STORAGE_DIRECTORY": str(storage[t.side])}
            ),
        )
        for tree in trees:
            run = runs[tree.side][0]
            programs, invalid, seconds = generate_phase(storage[tree.side])
            if programs:
                rates[tree.side] = programs / seconds
                text = (
                    f"{programs} programs ({invalid} draws rejected) in {seconds:.1f} s of test cases; end "
                    f"to end {programs / run.seconds:.2f}/s over {run.seconds:.1f} s wall"
                )
            else:
                fallback = True
                programs = max_examples(tree, profile)
                rates[tree.side] = programs / run.seconds
                text = (
                    f"NO hypothesis observations: FALLBACK {programs} max_examples / {run.seconds:.1f} s wall"
                )
            notes.append(f"{tree.side} ({tree.commit}): {text}; {run.summary}; load {run.load}")
    name = "fuzz on reference, programs/s" + (" (FALLBACK: max_examples / wall)" if fallback else "")
    before = rates.get("before")
    result = verdict(rates["after"] >= 10) + differ_flag(runs)
    row = Row(
        name,
        fmt(before, "/s", 1),
        fmt(rates["after"], "/s", 1),
        fmt(over(rates["after"], before)),
        ">= 10/s (after)",
        result,
    )
    row.notes = notes
    return row


def load_row(trees: list[Tree], rounds: int) -> Row:
    """``pytest --help`` with the plugin minus without it (``-p no:ptn``), best of ``rounds`` each; both
    variants of both trees alternate."""
    variants = {"with": [], "without": ["-p", "no:ptn"]}
    best: dict[tuple[str, str], float] = {}
    print(f"plugin load, best of {rounds}:", file=sys.stderr)
    load = loadavg()
    with tempfile.TemporaryDirectory(prefix="ptn-help-") as empty:
        for _ in range(rounds):
            for tree in trees:
                for variant, flags in variants.items():
                    t0 = time.perf_counter()
                    proc = subprocess.run(
                        [sys.executable, "-m", "pytest", "--help", *flags],
                        cwd=empty,
                        env=tree.env,
                        capture_output=True,
                        text=True,
                        check=False,
                    )
                    seconds = time.perf_counter() - t0
                    if proc.returncode or ("--ptn-backend" in proc.stdout) != (variant == "with"):
                        raise SystemExit(f"{tree.side}: pytest --help {flags} did not {variant} the plugin")
                    key = (tree.side, variant)
                    best[key] = min(best.get(key, seconds), seconds)
    cost = {t.side: (best[(t.side, "with")] - best[(t.side, "without")]) * 1000 for t in trees}
    cells = {
        t.side: f"{cost[t.side]:.0f} ms ({best[(t.side, 'with')]:.2f}/{best[(t.side, 'without')]:.2f} s)"
        for t in trees
    }
    ratio = over(cost["after"], cost.get("before"))
    row = Row(
        f"plugin load, pytest --help, best of {rounds}",
        cells.get("before", "-"),
        cells["after"],
        fmt(ratio),
        "<= 50 ms (after)",
        verdict(cost["after"] <= 50),
    )
    row.notes = [f"with minus without the plugin (with/without s); load {load} -> {loadavg()}"]
    for tree in trees:
        print(f"  {tree.side}: {cells[tree.side]}", file=sys.stderr)
    return row


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
    ap.add_argument(
        "--baseline",
        metavar="REV",
        help="commit to compare against, checked out in a temporary worktree (default: none, this checkout "
        "only, no ratios)",
    )
    ap.add_argument("--quick", action="store_true", help="small selections, one run each (minutes)")
    ap.add_argument(
        "--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)} (default all)"
    )
    ap.add_argument("--no-aoti", action="store_true", help="leave out the aoti rows")
    ap.add_argument("--repeat", type=int, default=None, help="runs per reference row (default 3; quick 1)")
    ap.add_argument("--aoti-workers", type=int, default=2)
    args = ap.parse_args()
    wanted = {name.strip() for name in args.rows.split(",") if name.strip()}
    if wanted - set(ROWS):
        ap.error(f"unknown rows {', '.join(sorted(wanted - set(ROWS)))}; known: {', '.join(ROWS)}")
    if args.no_aoti:
        wanted.discard("aoti")
    selection = QUICK if args.quick else FULL
    repeat = args.repeat or (1 if args.quick else 3)
    skipped = []
    spec = aoti_spec() if "aoti" in wanted else None
    if "aoti" in wanted and spec is None:
        wanted.discard("aoti")
        skipped.append("aoti rows skipped: the aoti backend is not usable here (reason above)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the worktree is removed

    with trees(args.baseline) as found:
        header = [
            f"machine: {machine()}",
            *(f"{t.side}: {t.commit} ({t.root})" for t in found),
            f"selection: {'--quick' if args.quick else 'full'}; wall time of the whole pytest process"
            + ("; runs paired before, after, before, ..." if args.baseline else ""),
        ]
        print("\n".join(header), file=sys.stderr, flush=True)
        rows: list[Row] = []
        if spec is not None:
            rows += aoti_rows(found, spec, args.aoti_workers, selection["aoti"])
        if "tests" in wanted:
            rows.append(tests_row(found, selection["tests"]))
        if "reference" in wanted:
            rows.append(reference_row(found, selection["reference"], repeat))
        if "fuzz" in wanted:
            rows.append(fuzz_row(found, selection["fuzz"]))
        if "load" in wanted:
            rows.append(load_row(found, 3 if args.quick else 10))
        for backend in BACKEND_GOALS:
            if backend in wanted:
                rows.append(backend_row(found, backend, selection[backend], repeat))

    print("\n".join(header) + "\n")
    headers = ["row", "before", "after", "after/before", "goal", "result"]
    print(table(headers, [[r.name, r.before, r.after, r.ratio, r.goal, r.result] for r in rows]))
    for r in rows:
        print(f"\n{r.name}:\n" + "\n".join(f"  {n}" for n in r.notes))
    for line in skipped:
        print(f"\n{line}")


if __name__ == "__main__":
    main()
