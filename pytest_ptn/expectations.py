"""Known failures of real backends (upstream bugs) as data, turned into strict expected failures.

One TOML file per backend (and version range) in ``conformance/expectations/``:

    backend = "native"
    requires = { executorch = ">=1.5,<1.6" }
    [[xfail]]
    rule = "E1"
    scenario = "colliding_literals"     # or "*"
    reason = "to_native rejects ..."
    link = "https://github.com/pytorch/executorch/pull/23891"
    schedule = "at_first_call"          # optional: only under this load schedule (pytest_ptn.schedule)
    intermittent = true                 # optional: it may pass or fail (WPT's [PASS, FAIL])
    [[xfail]]
    rule = "E1"
    scenario = "fuzz"
    mechanism = "zero-filled:state"     # the fuzz test's entries: one mechanism each (pytest_ptn.mechanisms)
    reason = "..."
    link = "..."

A listed failure that passes fails the run (strict xfail), so the data cannot go stale silently. An
``intermittent`` entry is of a verdict that depends on timing (a race that shows in some runs only): its
test may pass or fail, so it is a non-strict xfail, never stale, and the reports show it apart with what it
did this time. ``link`` may be ``""`` while no upstream issue is filed yet (a fresh baseline): the run header
counts such entries. ``python -m pytest_ptn expectations update`` writes and prunes these files from one run
or several.

The fuzz test's entries list mechanisms, not the test: a generated program whose every wrong value a listed
mechanism explains is counted and passed over, and the first with anything else fails the test. So a new
bug behind a known one still fails the run; an entry for the whole fuzz test would hide it, and is refused.
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from pytest_ptn.mechanisms import MechanismKeyError, check_key
from pytest_ptn.programs import zoo
from pytest_ptn.programs.catalogue import BY_NAME
from pytest_ptn.ruleset import RULES
from pytest_ptn.schedule import LoadSchedule

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


ENTRY_FIELDS = ("rule", "scenario", "reason", "link")
"""What every ``[[xfail]]`` entry states, each a string, non-empty but for ``link``."""
LINK_PENDING = ("link",)
"""Fields an entry may leave empty for now: a baseline lists failures before anyone files them upstream."""
ANY_SCENARIO = "*"
"""The scenario of an entry that holds for every scenario of its rule."""
SCHEDULES = tuple(s.value for s in LoadSchedule)
"""What an entry's optional ``schedule`` may say."""
FUZZ_SCENARIO = "fuzz"
"""The scenario the fuzz test's failures are reported and listed under."""


def file_name(backend: str) -> str:
    """The file a backend's known failures are kept in: ``ext:xnnpack`` in ``ext-xnnpack.toml``, as no file
    name holds ``:`` on every system (the file's own ``backend`` says which backend it is about)."""
    return f"{backend.replace(':', '-')}.toml"


class ExpectationsError(ValueError):
    """A malformed expectations file; the message names the file and the entry."""


@dataclass(frozen=True)
class Expectation:
    """One ``[[xfail]]`` entry: a failure a backend is known to have, which its tests are expected to show."""

    backend: str
    """The backend, as the file's ``backend`` names it."""
    rule: str
    """The rule that fails."""
    scenario: str
    """The scenario it fails on (the catalogue's, the zoo's, a host program's or ``fuzz``), or ``"*"``."""
    reason: str
    """Why, in one line: what the failing test reports."""
    link: str
    """The issue that tracks it; ``""`` until one is filed."""
    source: Path
    """The file it was read from, which a stale entry's message says to edit."""
    schedule: str | None = None
    """The load schedule (LoadSchedule value) the failure shows under; None: every schedule."""
    intermittent: bool = False
    """The test may pass or fail (its verdict depends on timing): expected, never stale either way."""
    mechanism: str | None = None
    """The fuzz test's entries: the mechanism (pytest_ptn.mechanisms key) whose programs it passes over."""

    def matches(
        self, backend: str, rules: list[str], scenario: str | None, schedule: str | None = None
    ) -> bool:
        """Whether this entry lists a test of ``rules`` on ``backend``, ``scenario`` and ``schedule``."""
        return (
            self.backend == backend
            and self.rule in rules
            and self.scenario in (ANY_SCENARIO, scenario)
            and self.schedule in (None, schedule)
        )

    def cell(self) -> str:
        """What the entry is about: ``P6 on colliding_literals`` (``, at_first_call`` for one schedule,
        ``, mechanism zero-filled:state`` for the fuzz test's)."""
        schedule = f", {self.schedule}" if self.schedule else ""
        return f"{self.rule} on {self.scenario}{schedule}" + (
            f", mechanism {self.mechanism}" if self.mechanism else ""
        )

    def describe(self) -> str:
        """The reason a listed test's xfail is reported with: the entry, and what to do once it passes."""
        link = self.link or "no link yet"
        if self.intermittent:
            return (
                f"known intermittent failure of {self.backend} on {self.rule}: {self.reason} ({link}); it "
                f"may pass or fail, and either is expected ({self.source})"
            )
        return (
            f"known failure of {self.backend} on {self.rule}: {self.reason} ({link}); "
            f"if this passes, the expectation is stale: remove it from {self.source}"
        )


@dataclass(frozen=True)
class ExpectationFile:
    """One file of known failures: one backend's, for the versions it names."""

    path: Path
    """Where it was read from."""
    backend: str
    """The backend its entries are about."""
    requires: dict[str, SpecifierSet]
    """Distribution -> the versions the entries hold for: a file for other versions is not used."""
    entries: tuple[Expectation, ...]
    """Its ``[[xfail]]`` entries."""

    def applies_to(self, backend: str, versions: dict[str, str]) -> bool:
        """Whether the file is about ``backend`` and every required distribution is installed at a version
        it names (``versions``: the backend's ``Availability.versions``)."""
        if backend != self.backend:
            return False
        for dist, spec in self.requires.items():
            installed = versions.get(dist)
            try:
                if installed is None or Version(installed) not in spec:
                    return False
            except InvalidVersion:
                return False
        return True

    def summary(self) -> list[str]:
        """The run header's lines about this file: what it lists, and once, the entries still to be linked
        (a header line, not a warning: hosts run with ``filterwarnings = error``)."""
        intermittent = sum(e.intermittent for e in self.entries)
        of_them = f", {intermittent} of them intermittent" if intermittent else ""
        lines = [
            f"ptn expectations for {self.backend}: {self.path} ({len(self.entries)} known failures{of_them})"
        ]
        unlinked = [e for e in self.entries if not e.link]
        if unlinked:
            lines.append(
                f"ptn expectations: {len(unlinked)} of {self.path.name} without a link (first: "
                f"{unlinked[0].rule} {unlinked[0].scenario}): add the issue that tracks each one (yours or "
                "upstream)"
            )
        return lines


def read(path: Path, user_scenarios: Collection[str] = ()) -> ExpectationFile:
    """Read and check one file; a scenario must be the catalogue's, the zoo's or one of ``user_scenarios``
    (the host's own programs, see pytest_ptn.run.hookspecs)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ExpectationsError(f"{path}: not UTF-8 text ({e})") from e
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ExpectationsError(f"{path}: {e}") from e
    backend = data.get("backend")
    if not isinstance(backend, str):
        raise ExpectationsError(f"{path}: 'backend' must name the backend the file is about")
    raw_requires, raw_entries = data.get("requires", {}), data.get("xfail", [])
    if not isinstance(raw_requires, dict):
        raise ExpectationsError(f"{path}: 'requires' must be a table of distribution = version specifier")
    if not isinstance(raw_entries, list) or not all(isinstance(e, dict) for e in raw_entries):
        raise ExpectationsError(f"{path}: 'xfail' must be an array of tables ([[xfail]])")
    requires: dict[str, SpecifierSet] = {}
    for dist, spec in raw_requires.items():
        if not isinstance(spec, str):
            raise ExpectationsError(
                f"{path}: requires.{dist} must be a version specifier string, not {spec!r}"
            )
        try:
            requires[dist] = SpecifierSet(spec)
        except InvalidSpecifier as e:
            raise ExpectationsError(f"{path}: requires.{dist}: {e}") from e
    entries = []
    for i, raw in enumerate(raw_entries):
        where = f"{path}: xfail #{i + 1}"
        missing = [k for k in ENTRY_FIELDS if raw.get(k) is None or (raw[k] == "" and k not in LINK_PENDING)]
        if missing:
            raise ExpectationsError(f"{where}: missing {', '.join(missing)}")
        not_text = [
            f"{k} must be a string, not {raw[k]!r}" for k in ENTRY_FIELDS if not isinstance(raw[k], str)
        ]
        if not_text:
            raise ExpectationsError(f"{where}: {'; '.join(not_text)}")
        if raw["rule"] not in RULES:
            raise ExpectationsError(f"{where}: unknown rule {raw['rule']!r}")
        known = (ANY_SCENARIO, FUZZ_SCENARIO, *BY_NAME, *zoo.BY_NAME, *user_scenarios)
        if raw["scenario"] not in known:
            raise ExpectationsError(f"{where}: unknown scenario {raw['scenario']!r}")
        schedule = raw.get("schedule")
        if schedule is not None and schedule not in SCHEDULES:
            raise ExpectationsError(
                f"{where}: schedule must be one of {', '.join(SCHEDULES)}, not {schedule!r}"
            )
        intermittent = raw.get("intermittent", False)
        if not isinstance(intermittent, bool):
            raise ExpectationsError(f"{where}: intermittent must be true or false, not {intermittent!r}")
        mechanism = _mechanism(where, raw)
        entries.append(
            Expectation(
                backend,
                raw["rule"],
                raw["scenario"],
                raw["reason"],
                raw["link"],
                path,
                schedule,
                intermittent,
                mechanism,
            )  # fmt: skip
        )
    return ExpectationFile(path, backend, requires, tuple(entries))


def _mechanism(where: str, raw: dict[str, object]) -> str | None:
    """An entry's ``mechanism``: every fuzz entry has one, no other entry does."""
    mechanism = raw.get("mechanism")
    if raw["scenario"] != FUZZ_SCENARIO:
        if mechanism is not None:
            raise ExpectationsError(
                f"{where}: only the fuzz test's entries (scenario = 'fuzz') list a mechanism"
            )
        return None
    if mechanism is None:
        raise ExpectationsError(
            f'{where}: a fuzz entry lists one mechanism (mechanism = "zero-filled:state"), not the whole '
            "test, which would hide every new bug behind a known one; `python -m pytest_ptn expectations "
            "update` writes them from a run"
        )
    if not isinstance(mechanism, str):
        raise ExpectationsError(f"{where}: mechanism must be a string, not {mechanism!r}")
    try:
        return check_key(mechanism)
    except MechanismKeyError as e:
        raise ExpectationsError(f"{where}: {e}") from None


def matching_no_test(
    entries: Collection[Expectation], cells: Collection[tuple[str, str | None, str | None]]
) -> list[Expectation]:
    """The entries no test can match: of a rule some of ``cells`` (the (rule, scenario, schedule) the
    collected tests' functions check) are of, and matching none of them. Such an entry is counted as a known
    failure and never reported, so it means nothing, as a stale one does (one of a rule no collected test
    checks is left alone: the run collected part of the suite)."""
    rules = {rule for rule, _, _ in cells}
    return [
        e
        for e in entries
        if e.rule in rules and not any(e.matches(e.backend, [r], sc, sh) for r, sc, sh in cells)
    ]


def shipped(suite: Path | None) -> list[Path]:
    """The expectation files shipped with the conformance suite."""
    folder = suite / "expectations" if suite is not None else None
    return sorted(folder.glob("*.toml")) if folder is not None and folder.is_dir() else []
