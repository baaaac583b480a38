"""``python -m pytest_ptn expectations update``: a backend's known-failure file brought in line with runs.

A baseline lists what fails today, so a new backend's run goes green and then can only get better; upkeep
removes the entries a fix made stale and adds what newly fails, keeping the reason and link someone wrote
for each entry that still fails. The outcome of a rule x scenario decides: a failure (``fail``, or ``xfail``
when the run used the file) keeps or adds its entry, a pass (``pass``, or ``xpass``: a stale strict xfail)
removes it, and a rule or scenario the run did not select leaves its entries alone.

Given several runs (their results.json files), a test that failed in one and passed in another makes its
entry intermittent: it may pass or fail, and is never stale. A failure of a rule whose verdict depends on
timing (ruleset.TIMING_DEPENDENT: S7) is written intermittent from one run, since the next run may not
catch the race. An intermittent entry is never removed: that all the runs given passed is no proof that
the race is gone (the summary says so, for a person to decide).

The files are written with tomlkit, which keeps an existing file's comments and layout: the entries are flat
tables a hand-written writer could print, but the shipped files carry comments (how each failure was
measured, where a group of entries starts) that a rewrite must not drop.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from pytest_ptn import DISTRIBUTION
from pytest_ptn.backend import Backend, availability_of, resolve_backend
from pytest_ptn.expectations import (
    ANY_SCENARIO,
    FUZZ_SCENARIO,
    Expectation,
    ExpectationFile,
    ExpectationsError,
    file_name,
    read,
)
from pytest_ptn.fuzzing.tally import merged
from pytest_ptn.mechanisms import Kind
from pytest_ptn.reporting import reasons, results
from pytest_ptn.reporting.collect import NO_BACKEND
from pytest_ptn.ruleset import RULES, TIMING_DEPENDENT

Cell = tuple[str, str]
"""(rule, scenario): what one expectation entry names. Rows without a scenario fall under ANY_SCENARIO, the
only entry that matches them."""

FAILING = (results.FAIL, results.XFAIL)
PASSING = (results.PASS, results.XPASS)

LINK_TO_FILL = "to fill in: the issue or PR that tracks this failure, in your tracker or upstream"
"""The comment a new entry's empty ``link`` carries in the file."""


@dataclass
class Update:
    """What ``update`` does to one expectations file."""

    path: Path
    backend: str
    kept: list[Expectation] = field(default_factory=list)
    stale: list[Expectation] = field(default_factory=list)
    added: list[Expectation] = field(default_factory=list)
    made_intermittent: list[Expectation] = field(default_factory=list)
    """Entries kept, and now intermittent: their tests both failed and passed in the runs."""
    notes: list[str] = field(default_factory=list)
    old_text: str = ""
    new_text: str = ""

    def diff(self) -> list[str]:
        before = self.old_text.splitlines(keepends=True)
        after = self.new_text.splitlines(keepends=True)
        source = str(self.path) if self.old_text else "/dev/null"
        return [line.rstrip("\n") for line in difflib.unified_diff(before, after, source, str(self.path))]

    def summary(self) -> list[str]:
        unlinked = sum(1 for e in (*self.kept, *self.added) if not e.link)
        new_intermittent = sum(e.intermittent for e in self.added)
        made = f", {len(self.made_intermittent)} made intermittent" if self.made_intermittent else ""
        lines = [
            f"{self.path}: {self.backend}: {len(self.kept)} kept{made}, {len(self.stale)} stale removed, "
            f"{len(self.added)} added"
            + (f" ({new_intermittent} intermittent)" if new_intermittent else "")
            + (f"; {unlinked} without a link: fill in `link`" if unlinked else "")
        ]
        return lines + [f"note: {note}" for note in self.notes]


def reason_of(failure: str) -> str:
    """A new entry's reason: the failure's first finding, not the header it opens with."""
    return reasons.headline(failure)


def outcomes_by_cell(rows: Iterable[results.Result]) -> dict[Cell, list[results.Result]]:
    cells: dict[Cell, list[results.Result]] = defaultdict(list)
    for row in rows:
        if row.rule in RULES:
            cells[(row.rule, row.scenario or ANY_SCENARIO)].append(row)
    return cells


Planned = tuple[Expectation, int | None]
"""An entry of the new file, with the index of the old file's table it keeps as it is (None: a new table)."""


def plan(
    path: Path, backend: str, entries: Iterable[Expectation], rows: Iterable[results.Result]
) -> tuple[Update, list[Planned]]:
    """Which entries stay, go or come, and the new file's entries in order: kept ones where they were (an
    ``*`` entry that now passes somewhere narrowed to the scenarios that still fail), new ones after.
    ``rows`` may hold several runs' results: a test found failing in one and passing in another makes its
    cell intermittent."""
    rows = list(rows)
    fuzz_rows = [r for r in rows if r.scenario == FUZZ_SCENARIO]
    rows = [r for r in rows if r.scenario != FUZZ_SCENARIO]
    entries = list(entries)
    fuzz_entries = [(i, e) for i, e in enumerate(entries) if e.mechanism is not None]
    by_test: list[Expectation | None] = [e if e.mechanism is None else None for e in entries]
    cells = outcomes_by_cell(rows)
    failing = {c for c, rs in cells.items() if any(r.outcome in FAILING for r in rs)}
    passing = {c for c, rs in cells.items() if any(r.outcome in PASSING for r in rs)}
    intermittent = {c for c in failing if c[0] in TIMING_DEPENDENT} | _flipping(cells)
    # A cell whose tests fail under one load schedule and pass under the other: its entry names the schedule.
    one_schedule = {
        c: s for c in (failing & passing) - intermittent if (s := _failing_schedule(cells[c])) is not None
    }
    passing = passing - set(one_schedule) - intermittent
    update = Update(path, backend)
    update.notes += [
        f"{rule} {scenario}: some tests fail and some pass; one entry cannot tell them apart, so the passing "
        "ones report as stale"
        for rule, scenario in sorted(failing & passing, key=_cell_order)
    ]
    final: list[Planned] = []
    for index, maybe in enumerate(by_test):
        if maybe is None:  # the fuzz test's: planned by mechanism below
            continue
        entry = maybe
        cell = (entry.rule, entry.scenario)
        if entry.intermittent:  # never stale: a pass is one of its outcomes
            update.kept.append(entry)
            final.append((entry, index))
            if cell in passing - failing:
                update.notes.append(
                    f"{entry.rule} {entry.scenario}: intermittent, and it passed in every run given; it is "
                    "kept (a race may not show for many runs): remove it by hand once it is fixed"
                )
            continue
        if cell in intermittent:  # its tests failed and passed: whatever schedule it named, either may
            if any(e.intermittent and e.matches(backend, [entry.rule], entry.scenario) for e, _ in final):
                update.stale.append(entry)  # the cell's other schedule: one intermittent entry holds both
                continue
            changed = dataclasses.replace(entry, intermittent=True, schedule=None)
            update.kept.append(changed)
            update.made_intermittent.append(changed)
            final.append((changed, index if entry.schedule is None else None))
            continue
        if cell in one_schedule and entry.schedule is None:  # narrowed to the schedule it fails under
            update.stale.append(entry)
            scheduled = dataclasses.replace(entry, schedule=one_schedule[cell])
            update.kept.append(scheduled)
            final.append((scheduled, None))
            continue
        if cell in one_schedule:
            passes = entry.schedule != one_schedule[cell]
        elif entry.scenario != ANY_SCENARIO:
            passes = cell in passing - failing
        else:  # narrowed where a scenario passes, or passes sometimes
            passes = any(rule == entry.rule for rule, _ in (passing - failing) | intermittent)
        if not passes:
            update.kept.append(entry)
            final.append((entry, index))
            continue
        update.stale.append(entry)
        if entry.scenario == ANY_SCENARIO:
            still = sorted((c for c in failing if c[0] == entry.rule), key=_cell_order)
            narrowed = [
                Expectation(backend, r, s, entry.reason, entry.link, path, None, (r, s) in intermittent)
                for r, s in still
            ]
            update.kept += narrowed
            final += [(e, None) for e in narrowed]
    for cell in sorted(failing, key=_cell_order):
        schedule = one_schedule.get(cell)
        if not any(e.matches(backend, [cell[0]], cell[1], schedule) for e, _ in final):
            first = next(r for r in cells[cell] if r.outcome in FAILING)
            reason = reason_of(first.reason)
            new = Expectation(backend, cell[0], cell[1], reason, "", path, schedule, cell in intermittent)
            update.added.append(new)
            final.append((new, None))
    final += _plan_mechanisms(update, backend, path, fuzz_entries, fuzz_rows)
    return update, final


def _plan_mechanisms(
    update: Update,
    backend: str,
    path: Path,
    entries: list[tuple[int, Expectation]],
    rows: list[results.Result],
) -> list[Planned]:
    """The fuzz test's entries, one per mechanism: kept while some run's programs showed it or no run
    tallied the fuzz test, dropped once every run that did saw none, added for what programs showed and
    no entry lists. A wrong value nothing explains is never listed: it is named in a note, to look into."""
    tallies = {r.nodeid: r.fuzz for r in rows if r.fuzz is not None}
    if not tallies:
        return [(e, i) for i, e in entries]
    seen = merged(tallies.values()).mechanisms
    final: list[Planned] = []
    for index, entry in entries:
        if entry.mechanism in seen or entry.intermittent:
            update.kept.append(entry)
            final.append((entry, index))
        else:
            update.stale.append(entry)
    listed = {e.mechanism for _, e in entries}
    for key, shown in seen.items():
        if key in listed:
            continue
        if key == Kind.UNEXPLAINED.value:
            update.notes.append(
                f"fuzz: {shown.programs} programs with a wrong value no mechanism explains: a finding to "
                "look into (the smallest is in the run's summary.md), never a known failure"
            )
            continue
        reason = (
            f"generated programs show {key} ({shown.programs} of {sum(t.programs for t in tallies.values())})"
        )
        new = Expectation(backend, "E1", FUZZ_SCENARIO, reason, "", path, mechanism=key)
        update.added.append(new)
        final.append((new, None))
    return final


def _flipping(cells: dict[Cell, list[results.Result]]) -> set[Cell]:
    """The cells with a test that failed in one of the runs and passed in another (the rows of several runs:
    one test, one rule, several rows)."""
    outcomes: dict[tuple[Cell, str], set[str]] = defaultdict(set)
    for cell, rows in cells.items():
        for r in rows:
            outcomes[(cell, r.nodeid)].add(r.outcome)
    return {
        cell
        for (cell, _), seen in outcomes.items()
        if not seen.isdisjoint(FAILING) and not seen.isdisjoint(PASSING)
    }


def _failing_schedule(rows: list[results.Result]) -> str | None:
    """The one load schedule under which a cell's tests fail while they pass under every other, or None."""
    failing = {r.schedule for r in rows if r.outcome in FAILING}
    passing = {r.schedule for r in rows if r.outcome in PASSING}
    if len(failing) == 1 and None not in failing and not failing & passing:
        return next(iter(failing))
    return None


def _cell_order(cell: Cell) -> tuple[tuple[int, str], str]:
    return results.rule_sort_key(cell[0]), cell[1]


def running_requires(dists: Iterable[str], provenance: dict[str, str]) -> dict[str, str]:
    """Version specifiers for a new file: from the run's version of each distribution the backend reports,
    up to the next minor release (where the failures have to be measured again)."""
    requires = {}
    for dist in dists:
        try:
            version = Version(provenance.get(dist, ""))
        except InvalidVersion:
            continue
        major, minor = (version.release + (0,))[:2]
        requires[dist] = f">={version.base_version},<{major}.{minor + 1}"
    return requires


def in_range(file: ExpectationFile, provenance: dict[str, str]) -> bool:
    """Whether the file's version range holds the run's versions, as far as the run recorded them."""
    recorded = {dist: spec for dist, spec in file.requires.items() if dist in provenance}
    return dataclasses.replace(file, requires=recorded).applies_to(file.backend, provenance)


# --- the TOML text ------------------------------------------------------------------------------------------


def _table(entry: Expectation) -> Any:
    import tomlkit

    table = tomlkit.table()
    table.add("rule", entry.rule)
    table.add("scenario", entry.scenario)
    if entry.mechanism is not None:
        table.add("mechanism", entry.mechanism)
    table.add("reason", entry.reason)
    if entry.schedule is not None:
        table.add("schedule", entry.schedule)
    if entry.intermittent:
        table.add("intermittent", True)
    link = tomlkit.string(entry.link)
    if not entry.link:
        link.comment(LINK_TO_FILL)
        link.trivia.comment_ws = "  "
    table.add("link", link)
    return table


def _trailing_comments(table: Any) -> list[Any]:
    """The comments after a table's last key (blank lines between them kept): in the file they introduce
    what follows, so they outlive the entry they happen to trail."""
    from tomlkit.items import Comment

    items = [item for key, item in table.value.body if key is None]
    at = [i for i, item in enumerate(items) if isinstance(item, Comment)]
    return items[at[0] : at[-1] + 1] if at else []


def _mark_intermittent(table: Any) -> None:
    """``intermittent = true`` after a kept table's last key, above the comments that trail it (they
    introduce the next entry)."""
    body = table.value.body
    trailing: list[Any] = []
    while body and body[-1][0] is None:  # comments and blank lines after the last key
        trailing.insert(0, body.pop()[1])
    table.add("intermittent", True)
    for item in trailing:
        table.add(item)


def render(base_text: str, final: list[Planned]) -> str:
    """The new file: ``base_text`` (the old file, or a new file's head) with its entries replaced by
    ``final``."""
    import tomlkit

    doc = tomlkit.parse(base_text)
    tables = list(doc.get("xfail", []))  # in the order of ExpectationFile.entries
    keeps = {index for _, index in final if index is not None}
    kept: list[Any] = []
    above_entries: list[Any] = []
    for index, table in enumerate(tables):
        if index in keeps:
            kept.append(table)
            continue
        comments = _trailing_comments(table)  # go with the entry before the removed one, else above all
        if comments and kept:
            kept[-1].add(tomlkit.nl())
        for comment in comments:
            kept[-1].add(comment) if kept else above_entries.append(comment)
    if "xfail" in doc:
        del doc["xfail"]
    for item in above_entries:
        doc.add(item)
    aot = tomlkit.aot()
    for entry, old_index in final:
        table = tables[old_index] if old_index is not None else _table(entry)
        if entry.intermittent and "intermittent" not in table:
            _mark_intermittent(table)
        aot.append(table)
    if len(aot):
        doc.add("xfail", aot)
    text: str = tomlkit.dumps(doc)
    return text


def new_head(backend: str, requires: dict[str, str], provenance: dict[str, str]) -> str:
    """A new file's comment, backend and version range."""
    import tomlkit

    measured = ", ".join(f"{d} {provenance[d]}" for d in requires) or "no versions reported"
    doc = tomlkit.document()
    for line in (
        f"Known failures of `{backend}`, measured with {DISTRIBUTION} {provenance.get('pytest_ptn', '?')} "
        f"({measured})",
        "and written by `python -m pytest_ptn expectations update`. Each entry is a strict xfail: one that",
        "starts passing fails the run as stale, but for an `intermittent` one, which may pass or fail (its",
        "verdict depends on timing). Fill in each empty `link` with the issue that tracks it.",
    ):
        doc.add(tomlkit.comment(line))
    doc.add("backend", backend)
    pins = tomlkit.inline_table()
    pins.update(requires)
    doc.add("requires", pins)
    doc.add(tomlkit.nl())
    text: str = tomlkit.dumps(doc)
    return text


# --- a run and its files ----------------------------------------------------------------------------------


def backend_names(rows: Iterable[results.Result]) -> dict[str, type[Backend]]:
    """The backend class of each ``--ptn-backend`` spec the run used (results name specs, files name
    backends: ``my_pkg.mod:MyBackend`` is ``mybackend``)."""
    specs = sorted({r.backend for r in rows if r.rule in RULES and r.backend != NO_BACKEND})
    return {spec: resolve_backend(spec) for spec in specs}


def update(docs: Sequence[results.Results], path: Path | None, where: Path) -> list[Update]:
    """Plan and render the update of ``path`` (or of ``<backend>.toml`` under ``where``, one per backend of
    the runs) from the results of one run or several; nothing is written."""
    if not docs:
        raise ValueError("no results to update from")
    doc = docs[0] if len(docs) == 1 else results.merge(docs)  # its provenance: what the runs share
    every_row = [r for d in docs for r in d.results]
    classes = backend_names(every_row)
    names = sorted({cls.name for cls in classes.values()})
    ran = {r.scenario for r in every_row if r.scenario is not None}  # the host's own programs too
    old = read(path, ran) if path is not None and path.exists() else None
    if old is not None:
        names = [old.backend] if old.backend in names else []
        if not names:
            held = ", ".join(sorted(f"{c.name} ({s})" for s, c in classes.items())) or "none"
            raise ExpectationsError(f"the results hold no backend {old.backend!r} (they hold: {held})")
    elif path is not None and len(names) != 1:
        raise ExpectationsError(
            f"the results hold {len(names)} backends ({', '.join(names) or 'none'}): a new {path} is for "
            "one; leave out --file to write <backend>.toml for each"
        )
    updates = []
    for name in names:
        specs = [s for s, c in classes.items() if c.name == name]
        target = path if path is not None else where / file_name(name)
        existing = old if old is not None else read(target, ran) if target.exists() else None
        rows = [r for r in every_row if r.backend in specs]
        update, final = plan(target, name, existing.entries if existing else (), rows)
        if existing is not None:
            update.old_text = target.read_text(encoding="utf-8")
            base = update.old_text
        else:
            dists = availability_of(specs[0], classes[specs[0]]).versions
            base = new_head(name, running_requires(dists, doc.provenance), doc.provenance)
        if existing is not None and not in_range(existing, doc.provenance):
            update.notes.append(
                f"the run's versions are outside {target.name}'s requires, so it did not apply to the run: "
                "widen `requires` by hand once the entries are right for these versions"
            )
        update.new_text = render(base, final)
        updates.append(update)
    return updates
