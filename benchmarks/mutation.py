"""The suite's mutation score over the reference implementation it ships (issue 67): cosmic-ray's mutants of
pytest_ptn/reference/*.py and pytest_ptn/instruments/content.py, each run against the conformance suite on
``--ptn-backend=reference``.

The tree is copied (the working files git tracks or does not ignore, or ``git archive`` of ``--rev``) into a
temporary folder, one copy per job, and mutants are applied there, one at a time, with ``PYTHONPATH`` on the
copy: the working tree is never touched. Each mutant runs the whole suite, serially, in an empty folder, and
the first finding stops it (benchmarks/_mutation_probe.py). A mutant is

- killed: a MUST test failed with a finding: outcome fail at level MUST in results.json (``--ptn-report``),
  and failed by a check, by the test's own assert, or raising with the backend under test on the stack;
- plugin crash: no finding, but a test failed with an exception raised in the harness (not through the
  backend), or the run itself broke (INTERNALERROR, usage or collection error, a signal): not killed;
- timeout: a run passed ``--timeout``; counted as killed in the score, as cosmic-ray counts it;
- equivalent: listed in benchmarks/mutation_equivalent.toml (file, operator, original and mutated text; the
  line only tells apart equal texts), with a reason; not run unless ``--run-equivalents``;
- survived: none of these after the whole suite, or on a statement the unmutated suite never executes
  (coverage.py, measured in the baseline run when more than COVERAGE_FROM mutants run): not run.

No fast selection runs first: the suite's first scenarios kill nearly every mutant that dies (measured: 29
of 31 in the first test file), so a selection would only add its own time to each survivor. Left out, as no
mutants: changes inside annotations (every file has ``from __future__ import annotations``) and the bare
``*`` of a signature, which cosmic-ray takes for a multiplication (its mutants do not compile). Score =
(killed + timeout) / (mutants - equivalent). Prints one row per file, then every survivor and plugin crash;
exits 1 if a mutant it ran survived or crashed the plugin (2: the unmutated suite does not pass).

``--baseline killers`` runs, instead of the whole unmutated suite first, only the tests that killed a mutant,
after the mutants: all a kill's verdict rests on, in seconds rather than the suite's minute or more, for a
small fixed sample (CI's, .ci/run); without coverage, a mutant on a statement never executed is run.

    python benchmarks/mutation.py [--sample N] [--files planner.py,zipdata.py] [--jobs 2] [--json OUT]
    python benchmarks/mutation.py --lines zipdata.py:43,planner.py:105   # the mutants of those lines
"""

from __future__ import annotations

import argparse
import ast
import compileall
import difflib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tomllib

_HERE = Path(__file__).resolve().parent
sys.path = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]  # see packaging.py

from _common import ROOT, table  # noqa: E402
from _mutation_probe import CRASH, FINDING  # noqa: E402
from cosmic_ray.commands import init  # noqa: E402
from cosmic_ray.mutating import mutate_code, use_mutation  # noqa: E402
from cosmic_ray.plugins import get_operator  # noqa: E402
from cosmic_ray.work_db import use_db  # noqa: E402

from pytest_ptn.reporting.results import FAIL, load  # noqa: E402
from pytest_ptn.ruleset import MUST  # noqa: E402

TARGETS = ["pytest_ptn/reference", "pytest_ptn/instruments/content.py"]
EQUIVALENTS = _HERE / "mutation_equivalent.toml"
PROBE = ".mutation-probe"
SUITE = ["--ptn-backend=reference", "--ptn-no-expectations", "-p", "no:cacheprovider", "-q", "-n", "0"]
SUITE += ["-W", "ignore::SyntaxWarning"]
"""A mutant ``x is "literal"`` warns when compiled, which the project's ``filterwarnings = error`` would turn
into a collection error wherever it is imported first: run it as Python runs it."""
SUITE_BASELINE, KILLERS_BASELINE = "suite", "killers"
COVERAGE_FROM = 40
"""Measuring coverage makes the baseline run about 2.5x longer (one suite's time more): worth it only where
it spares more full runs than that, on runs of many mutants."""
KILLED, SURVIVED, EQUIVALENT, PLUGIN_CRASH, TIMEOUT = (
    "killed",
    "survived",
    "equivalent",
    "plugin crash",
    "timeout",
)
VERDICTS = (KILLED, SURVIVED, EQUIVALENT, PLUGIN_CRASH, TIMEOUT)
NOT_EXECUTED = "not run: the suite never executes its statement"


@dataclass
class Mutant:
    file: str
    """Relative to the tree's root."""
    operator: str
    occurrence: int
    line: int
    col: int
    original: str = ""
    mutated: str = ""
    verdict: str = ""
    by: str = ""
    """The test that killed it, or where the plugin crashed."""
    should: list[str] = field(default_factory=list)
    """SHOULD rules that failed (reported, never a kill)."""
    seconds: float = 0.0
    reason: str = ""
    """An equivalent mutant's reason."""

    def describe(self) -> str:
        operator = self.operator.removeprefix("core/")
        return f"{self.file}:{self.line} {operator}: {self.original!r} -> {self.mutated!r}"


def copy_tree(dest: Path, rev: str | None) -> None:
    """The tree as it is (tracked or not ignored) or at ``rev``, with ``pytest_ptn/conformance`` linked to the
    copy's suite: the editable install would otherwise resolve the suite package to the checkout."""
    dest.mkdir(parents=True)
    if rev:
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    else:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, check=True, text=True,
        ).stdout  # fmt: skip
        for name in filter(None, listed.split("\0")):
            if (ROOT / name).is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, dest / name)
    (dest / "pytest_ptn" / "conformance").symlink_to(Path("..") / "conformance")
    (dest / PROBE).mkdir()  # the probe alone: benchmarks/ on the path would shadow `packaging` (packaging.py)
    shutil.copy2(_HERE / "_mutation_probe.py", dest / PROBE)
    compileall.compile_dir(dest / "pytest_ptn", quiet=1)


def no_operators(source: str) -> set[tuple[int, int]]:
    """(line, col) of what cosmic-ray mutates but the program never evaluates as written: every character
    of an annotation, and the bare ``*`` before keyword-only parameters."""
    spans: set[tuple[int, int]] = set()
    lines = source.splitlines(keepends=True)
    starts = [0]
    for text in lines:
        starts.append(starts[-1] + len(text))
    for node in ast.walk(ast.parse(source)):
        notes = []
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            notes.append(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            notes.append(node.returns)
        for n in notes:
            for line in range(n.lineno, (n.end_lineno or n.lineno) + 1):
                first = n.col_offset if line == n.lineno else 0
                last = n.end_col_offset if line == n.end_lineno else len(lines[line - 1])
                spans.update((line, c) for c in range(first, last or 0))
        if isinstance(node, ast.arguments) and node.kwonlyargs and node.vararg is None:
            first_kw = node.kwonlyargs[0]
            star = source.rfind("*", 0, starts[first_kw.lineno - 1] + first_kw.col_offset)
            row = next(i for i in range(len(lines)) if starts[i + 1] > star)
            spans.add((row + 1, star - starts[row]))
    return spans


def enumerate_mutants(tree: Path, files: list[str]) -> tuple[list[Mutant], int]:
    """Every mutant of ``files`` by cosmic-ray's operators (its ``init``), in a stable order, and how many
    mutations of no operator (``no_operators``) were left out."""
    with tempfile.TemporaryDirectory(prefix="ptn-mutation-db-") as tmp, use_db(f"{tmp}/s.sqlite") as db:
        init([tree / f for f in files], db, {})
        items = [i.mutations[0] for i in db.work_items]
    notes = {f: no_operators((tree / f).read_text()) for f in files}
    mutants, skipped = [], 0
    for m in items:
        file = str(Path(m.module_path).relative_to(tree))
        if tuple(m.start_pos) in notes[file]:
            skipped += 1
            continue
        mutants.append(Mutant(file, m.operator_name, m.occurrence, *m.start_pos))
    mutants.sort(key=lambda m: (m.file, m.line, m.col, m.operator, m.occurrence))
    return mutants, skipped


def describe(tree: Path, m: Mutant) -> bool:
    """Fill in the changed source lines, before and after: what the equivalents file and a reader match on.
    False if the mutant does not compile (no mutant of the program: left out)."""
    source = (tree / m.file).read_text()
    code = mutate_code(source, get_operator(m.operator)(), m.occurrence)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)  # `x is "literal"`: see SUITE
            compile(code or "", m.file, "exec")
    except SyntaxError:
        return False
    old, new = source.splitlines(), (code or source).splitlines()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag != "equal":
            m.line = i1 + 1
            m.original = " ".join(s.strip() for s in old[i1:i2])
            m.mutated = " ".join(s.strip() for s in new[j1:j2])
            break
    return code is not None


def mark_equivalents(mutants: list[Mutant], path: Path) -> list[str]:
    """Give each listed equivalent its reason (the nearest line where equal texts repeat); the entries that
    match no mutant, which the list should lose."""
    entries = tomllib.loads(path.read_text()).get("equivalent", []) if path.exists() else []
    stale = []
    for e in entries:
        same = [
            m
            for m in mutants
            if (m.file, m.operator, m.original, m.mutated)
            == (e["file"], e["operator"], e["original"], e["mutated"])
        ]
        if not same:
            stale.append(f"{e['file']}:{e['line']} {e['operator']}: {e['original']!r} -> {e['mutated']!r}")
            continue
        min(same, key=lambda m: abs(m.line - e["line"])).reason = e["reason"]
    return stale


@dataclass
class Run:
    """One pytest run of one selection on one mutant."""

    findings: list[str] = field(default_factory=list)
    """MUST tests that failed with a finding."""
    crashes: list[str] = field(default_factory=list)
    """Where the plugin crashed (a test's exception outside the backend, or the run's exit)."""
    should: list[str] = field(default_factory=list)
    timed_out: bool = False
    seconds: float = 0.0


def run_suite(
    tree: Path, timeout: float, coverage: Path | None = None, tests: list[str] | None = None
) -> Run:
    """Run the suite of ``tree`` (its package on PYTHONPATH) in an empty folder and read what failed;
    ``coverage``: measure the targets' lines into this JSON file; ``tests``: only these node ids."""
    with tempfile.TemporaryDirectory(prefix="ptn-mutation-") as tmp:
        work = Path(tmp)
        probe, report = work / "probe.jsonl", work / "report"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tree), str(tree / PROBE)]),
            "PTN_MUTATION_PROBE": str(probe),
            "HYPOTHESIS_STORAGE_DIRECTORY": str(work / "hypothesis"),
        }
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # a mutant and its restore can share an mtime second
        measure = []
        if coverage is not None:
            dirs = sorted({str(tree / Path(t).parent if t.endswith(".py") else tree / t) for t in TARGETS})
            measure = [*(f"--cov={d}" for d in dirs), f"--cov-report=json:{coverage}"]
        command = [
            sys.executable, "-m", "pytest", *[str(tree / t) for t in tests or ["conformance"]], *SUITE,
            *measure, "-p", "_mutation_probe", f"--ptn-report={report}", f"--basetemp={work / 'tmp'}",
        ]  # fmt: skip
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            command,
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            out = proc.communicate(timeout=timeout)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return Run(timed_out=True, seconds=time.perf_counter() - t0)
        run = Run(seconds=time.perf_counter() - t0)
        verdicts: dict[str, dict[str, str]] = {}
        if probe.exists():
            for line in probe.read_text().splitlines():
                rec = json.loads(line)
                verdicts.setdefault(rec["nodeid"], rec)
                if rec["verdict"] == CRASH:
                    run.crashes.append(f"{rec['where']} ({rec['nodeid']}: {rec['error'][:160]})")
        results = report / "results.json"
        if proc.returncode not in (0, 1) or not results.exists():
            tail = " | ".join(out.strip().splitlines()[-2:])[:300]
            run.crashes.append(f"exit {proc.returncode}: {tail}")
            return run
        for r in load(results).results:
            if r.outcome != FAIL:
                continue
            if r.level != MUST:
                run.should.append(r.rule)
            elif verdicts.get(r.nodeid, {}).get("verdict") == FINDING:
                run.findings.append(f"{r.rule} {r.nodeid}")
            elif r.nodeid not in verdicts:
                run.crashes.append(f"no probe record ({r.nodeid}: {r.reason[:160]})")
        if proc.returncode == 1 and not (run.findings or run.crashes or run.should):
            run.crashes.append(
                f"exit 1 with no failed test: {' | '.join(out.strip().splitlines()[-2:])[:300]}"
            )
        return run


def judge(m: Mutant, trees: queue.Queue[Path], timeout: float) -> Mutant:
    """Apply ``m`` in a free copy, run the suite on it, restore the copy."""
    tree = trees.get()
    t0 = time.perf_counter()
    try:
        with use_mutation(tree / m.file, get_operator(m.operator)(), m.occurrence) as (_, mutated):
            if mutated is None:
                raise RuntimeError(f"cosmic-ray applied no mutation for {m.describe()}")
            run = run_suite(tree, timeout)
    finally:
        trees.put(tree)
    m.seconds, m.should = time.perf_counter() - t0, sorted(set(run.should))
    if run.timed_out:
        m.verdict = TIMEOUT
    elif run.findings:
        m.verdict, m.by = KILLED, run.findings[0]
    else:
        m.verdict, m.by = (PLUGIN_CRASH, run.crashes[0]) if run.crashes else (SURVIVED, "")
    return m


def not_executed(tree: Path, mutants: list[Mutant], coverage: Path) -> list[Mutant]:
    """The mutants on statements the unmutated suite never executes (coverage.py's missing lines): they
    survive whatever they change, so they are not run."""
    files = {
        str(Path(k).resolve().relative_to(tree.resolve())): v
        for k, v in json.loads(coverage.read_text())["files"].items()
    }
    out = []
    for file in {m.file for m in mutants}:
        owner: dict[int, int] = {}  # line -> the first line of the innermost statement holding it
        stmts = [n for n in ast.walk(ast.parse((tree / file).read_text())) if isinstance(n, ast.stmt)]
        for n in sorted(stmts, key=lambda n: n.lineno - (n.end_lineno or n.lineno)):
            owner.update((line, n.lineno) for line in range(n.lineno, (n.end_lineno or n.lineno) + 1))
        missing = set(files.get(file, {}).get("missing_lines", []))
        out += [m for m in mutants if m.file == file and owner.get(m.line) in missing]
    return out


def sample(mutants: list[Mutant], n: int | None) -> list[Mutant]:
    """Every k-th mutant of the stable order, ``n`` of them: the same ones while the code does not change."""
    if n is None or n >= len(mutants):
        return mutants
    return [mutants[i * len(mutants) // n] for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample", type=int, help="run N mutants, every k-th of the stable order (default: all)")
    ap.add_argument("--files", help="comma-separated file names or paths among the targets (default: all)")
    ap.add_argument("--lines", help="comma-separated FILE:LINE: only the mutants of those lines")
    ap.add_argument(
        "--jobs", type=int, default=1, help="mutants run at once, each in its own copy (default 1)"
    )
    ap.add_argument("--rev", help="mutate `git archive REV` instead of the working files")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run of the suite (default 600)")
    ap.add_argument(
        "--baseline",
        choices=(SUITE_BASELINE, KILLERS_BASELINE),
        default=SUITE_BASELINE,
        help="the unmutated run that makes a kill count: the whole suite, first (default), or only the tests "
        "that killed a mutant, after the mutants (seconds, not the suite's minute or two: a small fixed "
        "sample, as CI runs; no coverage, so a mutant on a statement the suite never executes is run)",
    )
    ap.add_argument("--run-equivalents", action="store_true", help="run the listed equivalents too")
    ap.add_argument("--json", type=Path, help="write every mutant's verdict to this file")
    args = ap.parse_args()

    t_start = time.perf_counter()
    print(f"{os.cpu_count()} cores, load average {_load()} at start", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="ptn-mutation-trees-") as tmp:
        trees = [Path(tmp) / f"tree{i}" for i in range(args.jobs)]
        for tree in trees:
            copy_tree(tree, args.rev)
        files = sorted(
            str(p.relative_to(trees[0]))
            for t in TARGETS
            for p in ([trees[0] / t] if t.endswith(".py") else sorted((trees[0] / t).glob("*.py")))
            if p.name != "__init__.py"
        )
        if args.files:
            wanted = args.files.split(",")
            files = [f for f in files if any(f == w or f.endswith(f"/{w}") for w in wanted)]
            if len(files) < len(wanted):
                ap.error(f"--files: not all of {wanted} are targets ({', '.join(files)} matched)")
        mutants, left_out = enumerate_mutants(trees[0], files)
        if args.lines:
            lines = {tuple(x.rsplit(":", 1)) for x in args.lines.split(",")}
            mutants = [m for m in mutants if any(m.file.endswith(f) and str(m.line) == n for f, n in lines)]
        chosen = sample(mutants, args.sample)
        compiled = [m for m in chosen if describe(trees[0], m)]
        broken, chosen = len(chosen) - len(compiled), compiled
        stale = mark_equivalents(chosen, EQUIVALENTS)
        if len(chosen) + broken < len(mutants) or args.files or args.lines:
            stale = []  # a subset: entries outside it are not stale
        for m in chosen:
            if m.reason and not args.run_equivalents:
                m.verdict = EQUIVALENT
        todo = [m for m in chosen if not m.verdict]
        print(
            f"{len(mutants)} mutants of {len(files)} files ({left_out} in annotations or a signature's bare "
            f"* left out); {len(chosen)} chosen ({broken} more did not compile), {len(todo)} to run",
            file=sys.stderr,
            flush=True,
        )

        free: queue.Queue[Path] = queue.Queue()
        for tree in trees[1:]:
            free.put(tree)
        whole = args.baseline == SUITE_BASELINE
        base = Run()
        covered = Path(tmp) / "coverage.json" if whole and len(todo) > COVERAGE_FROM else None
        t_mutants = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            # the unmutated suite must pass: first, alone, where its coverage decides what runs; else beside
            # (or, --baseline killers, only the tests that killed, after the mutants: below)
            baseline = pool.submit(run_suite, trees[0], args.timeout, covered) if whole else None
            if baseline is not None:
                baseline.add_done_callback(lambda _: free.put(trees[0]))
            else:
                free.put(trees[0])
            if covered is not None:
                assert baseline is not None
                never = {id(m) for m in not_executed(trees[0], todo, _passed(baseline.result(), covered))}
                for m in todo:
                    if id(m) in never:
                        m.verdict, m.by = SURVIVED, NOT_EXECUTED
                todo = [m for m in todo if not m.verdict]
                t_mutants = time.perf_counter()
            for i, m in enumerate(pool.map(lambda m: judge(m, free, args.timeout), todo), 1):
                said = f" by {m.by}" if m.by else ""
                print(f"[{i}/{len(todo)}] {m.describe()}: {m.verdict}{said} ({m.seconds:.1f} s)",
                      file=sys.stderr, flush=True)  # fmt: skip
            if baseline is not None:
                _passed(baseline.result(), covered)
                base = baseline.result()
        t_mutants = time.perf_counter() - t_mutants
        if baseline is None:
            # a kill counts only where the test that made it passes on the unmutated tree
            killers = sorted({m.by.split(" ", 1)[1] for m in todo if m.verdict == KILLED})
            base = run_suite(trees[0], args.timeout, tests=killers) if killers else Run()
            _passed(base, None)

    wrong = [m for m in chosen if m.reason and m.verdict in (KILLED, TIMEOUT)]
    for m in chosen:
        if m.reason:
            m.verdict = EQUIVALENT
    report(chosen, files, wrong, stale)
    print(
        f"total {time.perf_counter() - t_start:.0f} s: {len(todo)} mutants run in {t_mutants:.0f} s with "
        f"--jobs {args.jobs} ({t_mutants / max(len(todo), 1):.1f} s per mutant; each "
        f"{sum(m.seconds for m in todo) / max(len(todo), 1):.1f} s on average), baseline "
        f"{'suite' if whole else 'of the killing tests'} {base.seconds:.0f} s"
        f"{' with coverage' if covered else ''}; load average {_load()} at the end"
    )
    if args.json:
        args.json.write_text(json.dumps([asdict(m) for m in chosen], indent=1))
    if any(m.verdict in (SURVIVED, PLUGIN_CRASH) for m in chosen):
        sys.exit(1)


def _passed(run: Run, coverage: Path | None) -> Path:
    """``coverage`` of the unmutated suite's run; exit 2 if that run found anything (each mutant would then
    read as killed)."""
    if run.findings or run.crashes or run.should or run.timed_out:
        sys.exit(f"the unmutated suite does not pass: {(run.findings + run.crashes + run.should)[:3]}")
    return coverage or Path()


def report(mutants: list[Mutant], files: list[str], wrong: list[Mutant], stale: list[str]) -> None:
    """The per-file table, then the survivors and plugin crashes one a line, for a test to be written."""
    rows = []
    for name in [*files, "total"]:
        ms = [m for m in mutants if name in ("total", m.file)]
        n = {v: sum(m.verdict == v for m in ms) for v in VERDICTS}
        live = len(ms) - n[EQUIVALENT]
        score = f"{(n[KILLED] + n[TIMEOUT]) / live:.1%}" if live else "-"
        rows.append([name.removeprefix("pytest_ptn/"), len(ms), *n.values(), score])
    print(table(["file", "mutants", *VERDICTS, "score"], rows))
    print("score = (killed + timeout) / (mutants - equivalent)")
    for title, verdict in (("survived", SURVIVED), ("plugin crash", PLUGIN_CRASH), ("timeout", TIMEOUT)):
        listed = [m for m in mutants if m.verdict == verdict]
        if listed:
            print(f"\n{title} ({len(listed)}):")
        for m in listed:
            extra = f" [SHOULD failed: {', '.join(m.should)}]" if m.should else ""
            print(f"  {m.describe()}{extra}" + (f"\n      {m.by}" if m.by else ""))
    for m in wrong:
        print(f"listed as equivalent, but {m.verdict}: {m.describe()} ({m.by})")
    for line in stale:
        print(f"{EQUIVALENTS.name}: matches no mutant: {line}")


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
