"""A fuzz test item's run: its share of the profile's programs, and the decorator that gives its ``@given``
test the profile, the seed and what the backend's expectations list (the ``ptn_fuzz`` fixture's value)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_ptn.fuzzing.sequence import owned

if TYPE_CHECKING:
    from pytest_ptn.backend import Backend
    from pytest_ptn.fuzzing.record import FuzzRecord


@dataclass(frozen=True)
class FuzzShare:
    """This test item's part of the fuzz budget: share ``index`` (0-based) of ``count``, one per xdist
    worker of each ``--ptn-shard`` machine, each drawing its own programs."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"share{self.index + 1}of{self.count}"


class FuzzRun:
    """The ``ptn_fuzz`` fixture: a decorator giving a ``@given`` test the run's fuzz profile and seed (its
    share of them), the mechanisms the backend's expectations list (``listed``), ``progress`` to say how
    many programs it has judged of its ``budget`` (shown on the terminal while a long fuzz runs), and the
    run's hang ``limit``."""

    def __init__(self, profile: Any, run_seed: int, share: FuzzShare, listed: dict[str, Any]):
        self.profile = profile
        self.run_seed = run_seed
        self.share = share
        self.listed = listed
        self.budget: int = (
            len(owned(share.index, share.count, profile.max_examples))
            if profile.derandomize
            else -(-profile.max_examples // share.count)
        )
        self.progress: Callable[[int], None] = lambda done: None
        self.limit = 0.0
        """Seconds a program judged apart may say nothing before it is hung (0: no limit)."""

    def record(self, backend: Backend) -> FuzzRecord:
        """What this item's programs on ``backend`` show, for its ``@given`` test to fill (fuzzing.record)."""
        from pytest_ptn.fuzzing.record import FuzzRecord

        return FuzzRecord(backend, set(self.listed), self.limit, self.progress)

    def __call__(self, test: Callable[..., None]) -> Any:
        from hypothesis import seed, settings

        if self.profile.derandomize:
            # ptn-ci: one fixed sequence of programs, the same in every run however it is split, each share
            # judging its part (pytest_ptn.fuzzing.sequence).
            from pytest_ptn.fuzzing.sequence import judged_in_turn

            programs = owned(self.share.index, self.share.count, self.profile.max_examples)
            return judged_in_turn(self.profile(test), programs)
        if self.share.count == 1:
            return seed(self.run_seed)(self.profile(test))
        # ptn-nightly: each share draws its own programs, by the run's seed and its index (the same ones in
        # every run with that seed and split).
        part = settings(self.profile, max_examples=self.budget)
        return seed(self.run_seed + self.share.index)(part(test))
