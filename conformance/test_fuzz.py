"""Generated programs that collide on purpose (pytest_ptn.strategies), run through the backend.

The fuzz profile decides how many programs (``--ptn-fuzz-profile``), split over the run's xdist workers and
``--ptn-shard`` machines (ptn-ci's are one fixed sequence, the same however the run is split). A program
whose every wrong value a mechanism the backend's expectations list explains is counted and passed over (the
run's summary has a tally per backend); a program with anything unlisted fails the test, printed as a test
you can paste, shrunk by the nightly profile without leaving its mechanism; two unlisted mechanisms are two
failures. ``--ptn-seed`` from the header reproduces a nightly run.
"""

from __future__ import annotations

import sys

import pytest

from pytest_ptn.backend import Backend, Whose, whose_of
from pytest_ptn.fuzzing.run import FuzzRun

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup  # hypothesis's own dependency there


@pytest.mark.E1
def test_generated_programs_match_eager(
    request: pytest.FixtureRequest,
    ptn_backend: Backend,
    ptn_fuzz: FuzzRun,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from hypothesis import event, given

    from pytest_ptn.check.earlier import EarlierPrograms
    from pytest_ptn.fuzzing.apart import dies_on_some, verdict_in_child
    from pytest_ptn.fuzzing.tally import TALLY_PROPERTY, FuzzTally
    from pytest_ptn.fuzzing.verdict import UnlistedMechanism, program_size, unlisted, verdict_on
    from pytest_ptn.mechanisms import Mechanism, Step
    from pytest_ptn.run.failure import FOUND, Found
    from pytest_ptn.run.state import FAILING_PROGRAMS
    from pytest_ptn.scheduling import crashes
    from pytest_ptn.spec import ProgramSpec
    from pytest_ptn.strategies import program_specs, reproducer

    listed = set(ptn_fuzz.listed)
    apart = dies_on_some(listed)
    earlier = EarlierPrograms()  # what the programs this process loaded held: a cache may outlive them

    def entering(step: Step) -> None:  # the step a crash of the worker names; a child has its own limit
        crashes.enter(ptn_backend.name, "a generated program", step.value, known=False, limited=not apart)

    tally = FuzzTally()
    failed: dict[str, ProgramSpec] = {}
    shown: dict[str, Mechanism] = {}  # each unlisted mechanism as the program that failed on it showed it
    whose_shown: dict[str, frozenset[Whose]] = {}
    drawn: set[str] = set()

    @ptn_fuzz
    @given(program_specs(stateful=ptn_backend.keeps_no_state() is None))
    def check(spec: ProgramSpec) -> None:
        crashes.attach(f"the program, as a test:\n\n{reproducer(spec)}")  # shown if the backend crashes
        workdir = tmp_path_factory.mktemp("fuzz")
        if apart:  # a listed crash or hang costs its program only
            verdict = verdict_in_child(ptn_backend, spec, workdir, ptn_fuzz.limit, entering)
        else:
            verdict = verdict_on(ptn_backend, spec, workdir, entering, earlier)
        program = reproducer(spec)
        if program not in drawn:  # hypothesis replays a failing program: one program, counted once
            drawn.add(program)
            tally.add(verdict.keys, listed, program, program_size(spec))
            ptn_fuzz.progress(len(drawn))
        for key in verdict.keys:
            event(f"ptn mechanism {key}: {'listed' if key in listed else 'UNLISTED'}")
        new = verdict.unlisted(listed)
        if new:
            failed[new[0]] = spec
            shown[new[0]] = next(m for m in verdict.mechanisms if m.key == new[0])
            whose_shown[new[0]] = verdict.whose
            raise unlisted(new[0])(f"mechanism {new[0]} is not listed: {verdict.message}")

    try:
        check()
        return
    except UnlistedMechanism as e:
        found: list[BaseException] = [e]
    except BaseExceptionGroup as group:  # several unlisted mechanisms
        unlisted_ones, unexpected = group.split(UnlistedMechanism)
        if unexpected is not None or unlisted_ones is None:
            raise
        found = list(unlisted_ones.exceptions)
    finally:
        request.node.user_properties.append((TALLY_PROPERTY, tally.finish(listed).to_json()))
    # Hypothesis replays each failing (nightly: shrunk) program last; its notes, which repeat the program,
    # stay behind with its exception: each program is printed once, as a test.
    backend = dict(request.node.user_properties).get("ptn_backend", ptn_backend.name)
    keys = [getattr(e, "key", "") for e in found]
    request.node.stash[FAILING_PROGRAMS] = [failed[key] for key in keys]
    whose = whose_of(w for key in keys for w in whose_shown[key])
    request.node.stash[FOUND] = Found(tuple(shown[key] for key in keys), whose)
    parts = [
        f"{e}\n\nthe program, as a test (run with --ptn-backend={backend}):\n\n{reproducer(failed[key])}"
        for key, e in zip(keys, found, strict=True)
    ]
    pytest.fail("\n\n".join(parts), pytrace=False)
