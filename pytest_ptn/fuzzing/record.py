"""What one fuzz test item's programs showed, and the test's outcome from it: each drawn program judged by
mechanism (in a child process for a backend known to crash or hang), counted once in the tally, and each
unlisted mechanism a failure of its own, printed with the program that showed it as a test you can paste.
The conformance test stays a ``@given`` test that hands each program here."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_ptn.backend import Backend, Whose, whose_of
from pytest_ptn.check.earlier import EarlierPrograms
from pytest_ptn.fuzzing.apart import dies_on_some, verdict_in_child
from pytest_ptn.fuzzing.tally import TALLY_PROPERTY, FuzzTally
from pytest_ptn.fuzzing.verdict import UnlistedMechanism, program_size, unlisted, verdict_on
from pytest_ptn.mechanisms import Mechanism, Step
from pytest_ptn.run.failure import FOUND, Found
from pytest_ptn.run.not_exercised import HELD
from pytest_ptn.run.state import FAILING_PROGRAMS
from pytest_ptn.scheduling import crashes

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup  # hypothesis's own dependency there

if TYPE_CHECKING:
    from pytest_ptn.spec import ProgramSpec


def exercised(spec: ProgramSpec) -> frozenset[str]:
    """The properties and relations ``spec``'s program holds, read from the spec as its exports would bind
    it (programs.survey.held_by: no export, which costs more than judging a program on a fast backend)."""
    from pytest_ptn.programs.survey import held_by, survey_of

    return frozenset(map(str, survey_of(held_by(spec)).found))


class FuzzRecord:
    """One fuzz test item's programs on ``backend`` (``FuzzRun.record`` makes it): ``listed``, the mechanisms
    its expectations list; ``limit``, the seconds a program judged apart may say nothing; ``progress``, told
    how many programs have run."""

    def __init__(
        self, backend: Backend, listed: set[str], limit: float, progress: Callable[[int], None]
    ) -> None:
        self.backend = backend
        self.listed = listed
        self.limit = limit
        self.progress = progress
        self.apart = dies_on_some(self.listed)
        self.earlier = (
            EarlierPrograms()
        )  # what the programs this process loaded held: a cache may outlive them
        self.tally = FuzzTally()
        self.failed: dict[str, ProgramSpec] = {}
        self.shown: dict[str, Mechanism] = {}  # each unlisted mechanism as the program that failed showed it
        self.whose: dict[str, frozenset[Whose]] = {}
        self.drawn: set[str] = set()
        self.held = (0, 0)
        """(constants the backend held, constants in all) over the programs whose lowering said."""

    def _entering(self, step: Step) -> None:
        """The step a crash of the worker names; a child has its own limit."""
        crashes.enter(
            self.backend.name, "a generated program", step.value, known=False, limited=not self.apart
        )

    def run_program(self, spec: ProgramSpec, workdir: Path) -> None:
        """Run one drawn program (inside the ``@given`` test): counted once, its mechanisms told to
        hypothesis as events, UnlistedMechanism (one class per key) for the first one not listed."""
        from hypothesis import event

        from pytest_ptn.strategies import reproducer

        crashes.attach(f"the program, as a test:\n\n{reproducer(spec)}")  # shown if the backend crashes
        if self.apart:  # a listed crash or hang costs its program only
            verdict = verdict_in_child(self.backend, spec, workdir, self.limit, self._entering)
        else:
            verdict = verdict_on(self.backend, spec, workdir, self._entering, self.earlier)
        program = reproducer(spec)
        if program not in self.drawn:  # hypothesis replays a failing program: one program, counted once
            self.drawn.add(program)
            self.tally.add(
                verdict.keys, self.listed, program, program_size(spec), exercised(spec), verdict.held
            )
            if verdict.held is not None:
                self.held = (self.held[0] + verdict.held[0], self.held[1] + verdict.held[1])
            self.progress(len(self.drawn))
        for key in verdict.keys:
            event(f"ptn mechanism {key}: {'listed' if key in self.listed else 'UNLISTED'}")
        new = verdict.unlisted(self.listed)
        if new:
            self.failed[new[0]] = spec
            self.shown[new[0]] = next(m for m in verdict.mechanisms if m.key == new[0])
            self.whose[new[0]] = verdict.whose
            raise unlisted(new[0])(f"mechanism {new[0]} is not listed: {verdict.message}")

    def run(self, test: Callable[[], None], item: pytest.Item) -> None:
        """Run the ``@given`` test and carry what it showed to ``item``: the tally (always), and for each
        unlisted mechanism its program (the repro bundles), what it found (the reports) and the failure."""
        from pytest_ptn.strategies import reproducer

        try:
            test()
            return
        except UnlistedMechanism as e:
            found: list[BaseException] = [e]
        except BaseExceptionGroup as group:  # several unlisted mechanisms
            unlisted_ones, unexpected = group.split(UnlistedMechanism)
            if unexpected is not None or unlisted_ones is None:
                raise
            found = list(unlisted_ones.exceptions)
        finally:
            item.user_properties.append((TALLY_PROPERTY, self.tally.finish(self.listed).to_json()))
            if self.tally.known:
                item.stash[HELD] = self.held
        # Hypothesis replays each failing (nightly: shrunk) program last; its notes, which repeat the
        # program, stay behind with its exception: each program is printed once, as a test.
        backend = dict(item.user_properties).get("ptn_backend", self.backend.name)
        keys = [getattr(e, "key", "") for e in found]
        item.stash[FAILING_PROGRAMS] = [self.failed[key] for key in keys]
        whose = whose_of(w for key in keys for w in self.whose[key])
        item.stash[FOUND] = Found(tuple(self.shown[key] for key in keys), whose)
        said = f"the program, as a test (run with --ptn-backend={backend})"
        parts = [
            f"{e}\n\n{said}:\n\n{reproducer(self.failed[key])}" for key, e in zip(keys, found, strict=True)
        ]
        pytest.fail("\n\n".join(parts), pytrace=False)
