"""What the fuzz test saw on one backend: programs run, and per mechanism how many programs showed it, the
smallest of them, and whether the backend's expectations list it. Made by the fuzz test (one per xdist
share), carried to the controller in the test's report, merged per backend for the terminal and summary.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

TALLY_PROPERTY = "ptn_fuzz"
"""The user property a fuzz test's tally travels in (JSON)."""


@dataclass
class Seen:
    """The programs that showed one mechanism."""

    programs: int
    listed: bool
    smallest: str
    """The smallest of them (fewest methods, then calls, then constants), as a test to paste."""
    size: tuple[int, int, int]


@dataclass
class FuzzTally:
    programs: int = 0
    clean: int = 0
    """Programs that showed no mechanism: every value right."""
    mechanisms: dict[str, Seen] = field(default_factory=dict)
    unseen: tuple[str, ...] = ()
    """Listed mechanisms no program showed: chance decides which programs a run draws, so this is news for
    ``expectations update`` over several runs, never a failure."""
    exercised: dict[str, int] = field(default_factory=dict)
    """Each property and relation of the survey (pytest_ptn.programs.survey) -> how many programs held it:
    what the run tried, and by its absence what it did not."""
    known: int = 0
    """Programs whose lowering said which constants the backend under test held (``Lowered.ownership``)."""
    exercising: int = 0
    """Of those, the programs with a constant the backend held: the rest did not exercise it."""

    def add(
        self,
        keys: Iterable[str],
        listed: Iterable[str],
        program: str,
        size: tuple[int, int, int],
        exercised: Iterable[str] = (),
        held: tuple[int, int] | None = None,
    ) -> None:
        """One program that showed ``keys`` (none: it passed) and held the properties and relations
        ``exercised``; ``held``: (constants the backend held, constants in all), where it says."""
        self.programs += 1
        if held is not None:
            self.known += 1
            self.exercising += held[0] > 0
        for found in exercised:
            self.exercised[found] = self.exercised.get(found, 0) + 1
        keys = list(dict.fromkeys(keys))
        self.clean += not keys
        listed = set(listed)
        for key in keys:
            seen = self.mechanisms.get(key)
            if seen is None:
                self.mechanisms[key] = Seen(1, key in listed, program, size)
                continue
            seen.programs += 1
            if size < seen.size:
                seen.smallest, seen.size = program, size

    def finish(self, listed: Iterable[str]) -> FuzzTally:
        self.unseen = tuple(sorted(set(listed) - set(self.mechanisms)))
        return self

    def ordered(self) -> list[tuple[str, Seen]]:
        """Unlisted mechanisms first, then by how many programs showed each."""
        return sorted(self.mechanisms.items(), key=lambda item: (item[1].listed, -item[1].programs, item[0]))

    def line(self, backend: str) -> str:
        """``fuzz on pte: 400 programs, 362 clean; UNLISTED unexplained x2 (smallest: 2 methods, 3 calls);
        zero-filled:state x31 (listed); unseen: shared-arena:state``."""
        shown = []
        for key, seen in self.ordered():
            methods, calls, _ = seen.size
            where = f"smallest: {methods} methods, {calls} calls"
            shown.append(f"{'' if seen.listed else 'UNLISTED '}{key} x{seen.programs} ({where})")
        if self.unseen:
            shown.append(f"listed, unseen: {', '.join(self.unseen)}")
        ran = f"fuzz on {backend}: {self.programs} programs, {self.clean} clean"
        if self.known:
            share = 100 * self.exercising / self.known
            ran += f", {self.exercising} of {self.known} ({share:.0f}%) with a constant {backend} held"
        return ran + "".join(f"; {part}" for part in shown)

    def coverage(self, backend: str) -> str:
        """``fuzz on pte exercised: nested paths x9, tied tensors x3, ...; not: same elements, other order``:
        what the programs held, of every property and relation a program can (pytest_ptn.programs.survey),
        so a green run says what it tried."""
        from pytest_ptn.programs.survey import EVERY

        held = [f"{name} x{self.exercised[name]}" for name in EVERY if name in self.exercised]
        missed = [name for name in EVERY if name not in self.exercised]
        line = f"fuzz on {backend} exercised: {', '.join(held) or 'nothing'}"
        return line + (f"; not: {', '.join(missed)}" if missed else "")

    def to_json(self) -> str:
        return json.dumps(
            {
                "programs": self.programs,
                "clean": self.clean,
                "mechanisms": {
                    k: {
                        "programs": s.programs,
                        "listed": s.listed,
                        "smallest": s.smallest,
                        "size": list(s.size),
                    }
                    for k, s in self.mechanisms.items()
                },
                "unseen": list(self.unseen),
                "exercised": self.exercised,
                "known": self.known,
                "exercising": self.exercising,
            }
        )

    @classmethod
    def from_data(cls, data: Any) -> FuzzTally:
        """From ``to_json``'s object; ValueError if it is not one."""
        try:
            return cls(
                int(data["programs"]),
                int(data["clean"]),
                {
                    str(k): Seen(int(s["programs"]), bool(s["listed"]), str(s["smallest"]), _size(s["size"]))
                    for k, s in data["mechanisms"].items()
                },
                tuple(str(k) for k in data["unseen"]),
                {str(k): int(n) for k, n in data.get("exercised", {}).items()},
                int(data.get("known", 0)),
                int(data.get("exercising", 0)),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a fuzz tally: {e}") from e


def _size(value: Any) -> tuple[int, int, int]:
    a, b, c = (int(v) for v in value)
    return a, b, c


def merged(tallies: Iterable[FuzzTally]) -> FuzzTally:
    """The tallies of one backend's shares (xdist workers, --ptn-shard machines) as one."""
    out = FuzzTally()
    unseen: set[str] | None = None
    for tally in tallies:
        out.programs += tally.programs
        out.clean += tally.clean
        for key, seen in tally.mechanisms.items():
            mine = out.mechanisms.get(key)
            if mine is None:
                out.mechanisms[key] = Seen(seen.programs, seen.listed, seen.smallest, seen.size)
                continue
            mine.programs += seen.programs
            if seen.size < mine.size:
                mine.smallest, mine.size = seen.smallest, seen.size
        out.known += tally.known
        out.exercising += tally.exercising
        for found, n in tally.exercised.items():
            out.exercised[found] = out.exercised.get(found, 0) + n
        unseen = set(tally.unseen) if unseen is None else unseen & set(tally.unseen)
    out.unseen = tuple(sorted((unseen or set()) - set(out.mechanisms)))
    return out
