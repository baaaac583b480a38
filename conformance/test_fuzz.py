"""Generated programs that collide on purpose (pytest_ptn.strategies), run through the backend.

The fuzz profile decides how many programs (``--ptn-fuzz-profile``), split over the run's xdist workers and
``--ptn-shard`` machines (ptn-ci's are one fixed sequence, the same however the run is split). A program
whose every wrong value a mechanism the backend's expectations list explains is counted and passed over (the
run's summary has a tally per backend); a program with anything unlisted fails the test, printed as a test
you can paste, shrunk by the nightly profile without leaving its mechanism; two unlisted mechanisms are two
failures. ``--ptn-seed`` from the header reproduces a nightly run.
"""

from __future__ import annotations

import pytest

from pytest_ptn.backend import Backend
from pytest_ptn.fuzzing.run import FuzzRun


@pytest.mark.E1
def test_generated_programs_match_eager(
    request: pytest.FixtureRequest,
    ptn_backend: Backend,
    ptn_fuzz: FuzzRun,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from hypothesis import given

    from pytest_ptn.spec import ProgramSpec
    from pytest_ptn.strategies import program_specs

    record = ptn_fuzz.record(ptn_backend)

    @ptn_fuzz
    @given(program_specs(stateful=ptn_backend.keeps_no_state() is None))
    def check(spec: ProgramSpec) -> None:
        record.run_program(spec, tmp_path_factory.mktemp("fuzz"))

    record.run(check, request.node)
