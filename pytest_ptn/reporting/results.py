"""The results.json schema as plain data: outcomes, rows, loading, saving, merging and diffing.

Kept free of pytest (and of torch) so that CI can merge and compare result files from several machines
with nothing but Python.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_ptn.backend import Whose
from pytest_ptn.fuzzing.tally import FuzzTally
from pytest_ptn.mechanisms import Mechanism, from_data, to_data
from pytest_ptn.ruleset import LEVELS, RULES
from pytest_ptn.scheduling.shards import SHARD_FORMAT

SCHEMA = "pytest-ptn/results"
SCHEMA_VERSION = 1

PASS = "pass"
XFAIL = "xfail"
FAIL = "fail"
XPASS = "xpass"
NOT_APPLICABLE = "not_applicable"
NOT_EXERCISED = "not_exercised"
"""A test that passed on a program whose constants the backend under test held none of (a delegate that took
none): it says nothing of the backend's own constant handling (Spec v6)."""
SKIP = "skip"
OUTCOMES = (PASS, XFAIL, FAIL, XPASS, NOT_EXERCISED, NOT_APPLICABLE, SKIP)
INTERMITTENT_OUTCOMES = (PASS, XFAIL)
"""What a test its expectation lists as intermittent did this time (Result.intermittent): passed, or failed
as expected."""

# Count letters for the terminal; pytest's own letters where it has one, so the table reads like `-rA`.
# Ordered so the worrying counts come first in a cell.
OUTCOME_LETTERS = {
    FAIL: "F",
    XPASS: "X",
    XFAIL: "x",
    NOT_EXERCISED: "e",
    PASS: "p",
    NOT_APPLICABLE: "-",
    SKIP: "s",
}
OUTCOME_WORDS = {
    FAIL: "fail",
    XPASS: "xpass",
    XFAIL: "xfail",
    NOT_EXERCISED: "not exercised",
    PASS: "pass",
    NOT_APPLICABLE: "n/a",
    SKIP: "skip",
}

UNKNOWN_RULE = "?"
"""The rule of a test that failed without ptn properties (a crash or internal error report): counted as a MUST
failure so that no failed test is left out of the matrix."""
UNKNOWN_RULE_TITLE = "rules unknown: a test failed"

MAX_REASON_LINES = 40
MAX_REASON_CHARS = 4000


class ResultsFormatError(ValueError):
    """A results file that is not a pytest-ptn results document this version can read."""


@dataclass(frozen=True)
class Result:
    """One (test, rule) outcome: a test that checks several rules yields one Result per rule."""

    rule: str
    level: str
    scenario: str | None
    backend: str
    outcome: str
    reason: str
    repro: str
    seed: int | None
    nodeid: str
    schedule: str | None = None
    """The load schedule the test ran under (pytest_ptn.schedule), for the E tests; None elsewhere."""
    intermittent: bool = False
    """An expectation lists the test as intermittent (pytest_ptn.expectations): it may pass or fail, and
    ``outcome`` (pass or xfail) is what it did this time; reports show it apart."""
    fuzz: FuzzTally | None = None
    """The fuzz test's tally: programs run, and what each mechanism showed in (fuzzing.tally)."""
    mechanisms: tuple[Mechanism, ...] = ()
    """How a failed test's failure came about, as its checks found it (pytest_ptn.mechanisms): what the
    causes group it by. None found (a check of the test's own): the causes group it by its first line."""
    whose: str | None = None
    """Whose a failed test's failure is (a backend.Whose value), where the backend has a witness."""
    owned: tuple[int, int] | None = None
    """(constants the backend under test held, constants the test checked), where the backend says which it
    holds (``Lowered.ownership``): a delegate's share of the program; None: unknown, or no program lowered."""


@dataclass(frozen=True)
class RunStatus:
    """How much of its selection a run checked: a report must never claim more than was checked.

    ``stopped`` says why a run did not finish (None: it did); ``selected`` is None where it is unknown (a
    merge missing a shard); ``shard`` is ``K/N`` for one shard of a ``--ptn-shard`` run.
    """

    selected: int | None
    finished: int
    stopped: str | None = None
    shard: str | None = None

    @property
    def complete(self) -> bool:
        return self.stopped is None

    def headline(self) -> str:
        """``INCOMPLETE: 121 of 274 selected tests finished; stopped: ...``, for every rendering."""
        of = f" of {self.selected} selected" if self.selected is not None else ""
        shard = f" (shard {self.shard})" if self.shard else ""
        return f"INCOMPLETE{shard}: {self.finished}{of} tests finished; {self.stopped}"


@dataclass
class Results:
    """A results document. `sources` lists the provenance of each run a merged document came from; `run`
    says whether the run (all of them, merged) finished, None in files written before it was recorded."""

    spec_version: str
    provenance: dict[str, str]
    results: list[Result]
    sources: list[dict[str, str]] = field(default_factory=list)
    run: RunStatus | None = None

    @property
    def complete(self) -> bool:
        return self.run is None or self.run.complete

    @property
    def incomplete_headline(self) -> str | None:
        """What every rendering of an incomplete run opens with; None for a complete one."""
        return self.run.headline() if self.run is not None and not self.run.complete else None


def rule_sort_key(rule: str) -> tuple[int, str]:
    """Spec order (P1..P10, E.., S.., X..) for known rules; unknown ids after, alphabetically."""
    order = list(RULES)
    return (order.index(rule), "") if rule in RULES else (len(order), rule)


def backend_sort_key(backend: str) -> tuple[bool, str]:
    """`reference` first: it is the baseline every other column is read against."""
    return (backend != "reference", backend)


def level_sort_key(level: str) -> tuple[int, str]:
    return (LEVELS.index(level), "") if level in LEVELS else (len(LEVELS), level)


def sort_results(results: Iterable[Result]) -> list[Result]:
    """A canonical order (MUST before SHOULD, then spec order), so runs that differ only in scheduling
    (xdist) give identical files and failure lists start with what fails the run."""
    return sorted(
        results,
        key=lambda r: (level_sort_key(r.level), rule_sort_key(r.rule), backend_sort_key(r.backend), r.nodeid),
    )


# --- results.json -----------------------------------------------------------------------------------


def to_dict(doc: Results) -> dict[str, Any]:
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "spec_version": doc.spec_version,
        "provenance": dict(doc.provenance),
        "results": [{**asdict(r), "mechanisms": to_data(r.mechanisms)} for r in sort_results(doc.results)],
    }
    if doc.sources:
        data["sources"] = [dict(s) for s in doc.sources]
    if doc.run is not None:
        data["run"] = {"complete": doc.run.complete, **asdict(doc.run)}
    return data


def from_dict(data: Any) -> Results:
    """Validate as we read: a report built from a half-understood file would silently misstate results."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ResultsFormatError(f"not a {SCHEMA} document")
    if data.get("version") != SCHEMA_VERSION:
        raise ResultsFormatError(
            f"{SCHEMA} version {data.get('version')!r} is not supported "
            f"(this pytest-ptn reads version {SCHEMA_VERSION})"
        )
    if not isinstance(data.get("results"), list):
        raise ResultsFormatError(f"malformed {SCHEMA} document: results must be a list")
    try:
        results = [_result(i, row) for i, row in enumerate(data["results"])]
        doc = Results(
            spec_version=str(data["spec_version"]),
            provenance={str(k): str(v) for k, v in data["provenance"].items()},
            results=results,
            sources=[{str(k): str(v) for k, v in s.items()} for s in data.get("sources", [])],
            run=run_status(data["run"]) if "run" in data else None,
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ResultsFormatError(f"malformed {SCHEMA} document: {exc}") from exc
    return doc


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "rule": (str,),
    "level": (str,),
    "scenario": (str, type(None)),
    "backend": (str,),
    "outcome": (str,),
    "reason": (str,),
    "repro": (str,),
    "seed": (int, type(None)),
    "nodeid": (str,),
    "schedule": (str, type(None)),
    "intermittent": (bool,),
    "fuzz": (dict, type(None)),
    "mechanisms": (list,),
    "whose": (str, type(None)),
    "owned": (list, tuple, type(None)),
}
OPTIONAL_FIELDS: dict[str, Any] = {
    "schedule": None,
    "intermittent": False,
    "fuzz": None,
    "mechanisms": [],
    "whose": None,
    "owned": None,
}
"""Fields a row written before they existed may lack, with the value that means."""


def _result(index: int, row: Any) -> Result:
    """One results row, every field of the type the renderings and merge rely on."""
    where = f"result #{index}"
    if not isinstance(row, dict):
        raise ResultsFormatError(f"{where} is not an object: {reprlib.repr(row)}")
    where += f" ({reprlib.repr(row.get('nodeid'))})"
    row = {**OPTIONAL_FIELDS, **row}
    if set(row) != set(_FIELD_TYPES):
        fields = ", ".join(sorted(set(row) ^ set(_FIELD_TYPES)))
        raise ResultsFormatError(f"{where}: missing or unknown fields: {fields}")
    for name, types in _FIELD_TYPES.items():
        value = row[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            kind = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise ResultsFormatError(f"{where}: {name} must be {kind}, not {reprlib.repr(value)}")
    if row["level"] not in LEVELS:
        raise ResultsFormatError(f"{where}: level must be one of {', '.join(LEVELS)}, not {row['level']!r}")
    if row["outcome"] not in OUTCOMES:
        raise ResultsFormatError(f"{where}: unknown outcome {reprlib.repr(row['outcome'])}")
    if row["intermittent"] and row["outcome"] not in INTERMITTENT_OUTCOMES:
        raise ResultsFormatError(
            f"{where}: an intermittent test passes or fails as expected, not {row['outcome']!r}"
        )
    if row["fuzz"] is not None:
        try:
            row["fuzz"] = FuzzTally.from_data(row["fuzz"])
        except ValueError as e:
            raise ResultsFormatError(f"{where}: fuzz: {e}") from None
    if row["whose"] is not None and row["whose"] not in set(Whose):
        raise ResultsFormatError(f"{where}: whose must be one of {', '.join(Whose)}, not {row['whose']!r}")
    if row["owned"] is not None:
        owned = tuple(row["owned"])
        if len(owned) != 2 or not all(map(_count, owned)) or owned[0] > owned[1]:
            raise ResultsFormatError(f"{where}: owned must be [held, checked] counts, not {owned!r}")
        row["owned"] = owned
    try:
        row["mechanisms"] = from_data(row["mechanisms"])
    except ValueError as e:
        raise ResultsFormatError(f"{where}: mechanisms: {e}") from None
    return Result(**row)


def run_status(data: Any) -> RunStatus:
    """The ``run`` object of a results document (or of a verdict stream's header and end)."""
    if not isinstance(data, dict):
        raise ResultsFormatError(f"run must be an object, not {reprlib.repr(data)}")
    selected, finished = data.get("selected"), data.get("finished")
    stopped, shard = data.get("stopped"), data.get("shard")
    if not (selected is None or _count(selected)) or not _count(finished):
        raise ResultsFormatError(f"run: selected and finished must be counts: {reprlib.repr(data)}")
    if not (stopped is None or isinstance(stopped, str)):
        raise ResultsFormatError(f"run: stopped must be text or null, not {reprlib.repr(stopped)}")
    if shard is not None and not valid_shard(shard):
        raise ResultsFormatError(
            f"run: shard must be K/N with 1 <= K <= N, or null, not {reprlib.repr(shard)}"
        )
    if data.get("complete") is False and stopped is None:
        raise ResultsFormatError("run: an incomplete run must say why it stopped")
    return RunStatus(selected, data["finished"], stopped, shard)


def valid_shard(value: Any) -> bool:
    match = SHARD_FORMAT.fullmatch(value) if isinstance(value, str) else None
    return match is not None and int(match[1]) <= int(match[2])


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def load(path: Path) -> Results:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ResultsFormatError(f"{path}: not UTF-8 text: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ResultsFormatError(f"{path}: not JSON: {exc}") from exc
    except RecursionError as exc:
        raise ResultsFormatError(f"{path}: JSON nested too deeply to read") from exc
    try:
        return from_dict(data)
    except ResultsFormatError as exc:
        raise ResultsFormatError(f"{path}: {exc}") from exc


def save(doc: Results, path: Path, derived: dict[str, Any] | None = None) -> None:
    """Written beside and renamed over ``path``: a reader never sees half a file, even after a kill.
    ``derived``: what the renderings computed from the results (the causes), written beside them for
    machines; reading a file ignores it, since it follows from the results."""
    data = {**to_dict(doc), **(derived or {})}
    write_whole(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_whole(path: Path, text: str) -> None:
    """``text`` written beside ``path`` and renamed over it; an error (a full disk) leaves nothing half
    written, neither ``path`` nor the file beside it, and is raised."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    except OSError:
        partial.unlink(missing_ok=True)
        raise


# --- merge and diff -----------------------------------------------------------------------------------


def merge(docs: Sequence[Results]) -> Results:
    """Combine runs (typically one per backend or machine) into one matrix.

    A (nodeid, rule, backend) present in several inputs keeps the later input's row, so re-running one
    backend and merging it last replaces its stale results.
    """
    if not docs:
        raise ValueError("nothing to merge")
    spec_versions = {d.spec_version for d in docs}
    if len(spec_versions) > 1:
        raise ResultsFormatError(f"cannot merge results of different spec versions: {sorted(spec_versions)}")
    rows: dict[tuple[str, str, str], Result] = {}
    sources: list[dict[str, str]] = []
    for doc in docs:
        for r in doc.results:
            rows[(r.nodeid, r.rule, r.backend)] = r
        if doc.sources:
            sources.extend(doc.sources)
        else:
            backends = sorted({r.backend for r in doc.results}, key=backend_sort_key)
            sources.append({**doc.provenance, "backends": ", ".join(backends)})
    common = dict(sources[0])
    for source in sources[1:]:
        common = {k: v for k, v in common.items() if source.get(k) == v}
    return Results(spec_versions.pop(), common, sort_results(rows.values()), sources, merged_status(docs))


def merged_status(docs: Sequence[Results]) -> RunStatus | None:
    """The runs together: incomplete when one of them is, or when shards of a ``--ptn-shard`` run are
    missing (named K/N: a shard that never reported is as unchecked as one that stopped). A shard given
    again (run again after it stopped) replaces the earlier, as its rows do."""
    runs = [d.run for d in docs if d.run is not None]
    if not runs:
        return None
    by_shard = {run.shard: run for run in runs if run.shard}
    runs = [run for run in runs if not run.shard] + [by_shard[s] for s in sorted(by_shard, key=_shard_key)]
    shards = set(by_shard)
    missing = [
        f"{k}/{count}"
        for count in sorted({int(shard.split("/")[1]) for shard in shards})
        for k in range(1, count + 1)
        if f"{k}/{count}" not in shards
    ]
    problems = [f"shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} missing"] if missing else []
    problems += [
        f"{f'shard {run.shard}' if run.shard else 'a run'}: {run.stopped}" for run in runs if run.stopped
    ]
    counts = [run.selected for run in runs]
    selected = None if missing or None in counts else sum(c for c in counts if c is not None)
    return RunStatus(selected, sum(run.finished for run in runs), "; ".join(problems) or None)


def _shard_key(shard: str) -> tuple[int, int]:
    index, count = shard.split("/")
    return int(count), int(index)


def one_line(text: str, limit: int = 300) -> str:
    """The first non-empty line, whitespace collapsed and capped, so a reason fits in a table cell."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = " ".join(line.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def whole_reason(text: str, max_lines: int = MAX_REASON_LINES, max_chars: int = MAX_REASON_CHARS) -> str:
    """The whole failure message (every mismatch line is the finding), capped so that one runaway message
    cannot swamp a report: at most ``max_lines`` lines and about ``max_chars`` characters."""
    lines = [ln.rstrip() for ln in text.strip("\n").splitlines()]
    kept: list[str] = []
    size = 0
    for line in lines:
        if len(kept) == max_lines or size + len(line) > max_chars:
            break
        kept.append(line)
        size += len(line) + 1
    if not kept and lines:  # one line longer than the whole budget
        kept = [lines[0][: max_chars - 3] + "..."]
    dropped = len(lines) - len(kept)
    if dropped:
        kept.append(f"... {dropped} more line{'s' if dropped > 1 else ''}")
    return "\n".join(kept)
