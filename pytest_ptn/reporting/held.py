"""What share of the constants its tests checked each backend under test held (Spec v6): a green cell of a
delegate that held none of them says nothing of the delegate, and the reports say so, per backend and once at
the end of a run where it held nothing at all."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_ptn.reporting.results import NOT_EXERCISED, Result


@dataclass
class HeldShare:
    """One backend's tests whose ownership is known: the constants they checked and the backend held."""

    tests: int = 0
    held: int = 0
    checked: int = 0
    not_exercised: int = 0

    def line(self, backend: str) -> str:
        """``pte-xnnpack held 41 of 120 checked constants (34%) over 30 tests; 3 not exercised``."""
        share = f" ({100 * self.held / self.checked:.0f}%)" if self.checked else ""
        line = f"{backend} held {self.held} of {self.checked} checked constants{share}"
        line += f" over {self.tests} tests"
        return line + (f"; {self.not_exercised} not exercised" if self.not_exercised else "")


def held_shares(rows: Sequence[Result]) -> dict[str, HeldShare]:
    """backend -> its share, each test counted once whatever rules it checks; backends that never said which
    constants they held are left out (unknown, never assumed)."""
    out: dict[str, HeldShare] = {}
    seen: set[tuple[str, str]] = set()
    for r in rows:
        if r.owned is None or (r.nodeid, r.backend) in seen:
            continue
        seen.add((r.nodeid, r.backend))
        share = out.setdefault(r.backend, HeldShare())
        share.tests += 1
        share.held += r.owned[0]
        share.checked += r.owned[1]
        share.not_exercised += r.outcome == NOT_EXERCISED
    return dict(sorted(out.items()))


def nothing_held(shares: dict[str, HeldShare]) -> list[str]:
    """One line per backend that held none of the constants any of its tests checked."""
    return [
        f"{backend} held none of the constants its tests checked: its results say nothing of its own "
        "constant handling (its partitioners took nothing)"
        for backend, share in shares.items()
        if share.checked and not share.held
    ]
