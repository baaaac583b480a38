"""Generated programs that collide on purpose (pytest_ptn.strategies), run through the backend.

The fuzz profile decides how many programs (``--ptn-fuzz-profile``); a failure prints its program as a test
you can paste, shrunk to a small one by the nightly profile (the CI one reports the first failing program
as drawn), and ``--ptn-seed`` from the header reproduces a nightly run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pytest_ptn.backend import Backend


@pytest.mark.E1
def test_generated_programs_match_eager(
    request: pytest.FixtureRequest,
    ptn_backend: Backend,
    ptn_fuzz: Callable[[Callable[..., None]], Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from hypothesis import given

    from pytest_ptn.harness import check_spec, fail_on
    from pytest_ptn.run.state import FAILING_PROGRAM
    from pytest_ptn.scheduling import crashes
    from pytest_ptn.spec import ProgramSpec
    from pytest_ptn.strategies import program_specs, reproducer

    failed: list[ProgramSpec] = []

    @ptn_fuzz
    @given(program_specs(stateful=ptn_backend.keeps_no_state() is None))
    def check(spec: ProgramSpec) -> None:
        crashes.attach(f"the program, as a test:\n\n{reproducer(spec)}")  # shown if the backend crashes
        crashes.enter(ptn_backend.name, "a generated program", "checking", known=False)  # one step each
        try:
            fail_on(
                check_spec(ptn_backend, spec, tmp_path_factory.mktemp("fuzz")), "outputs differ from eager"
            )
            return
        except pytest.fail.Exception as e:  # a lowering error or mismatches
            message = e.msg
        except Exception as e:  # the backend raised while loading or running
            message = f"{type(e).__name__}: {e}"
        failed.append(spec)
        # Raised outside the handlers, so every failure looks alike to hypothesis: one bug, not a group.
        pytest.fail(message, pytrace=False)

    try:
        check()
        return
    except pytest.fail.Exception as e:
        if not failed:
            raise
        message = e.msg
    # Hypothesis replays the failing (nightly: the shrunk) program last. Its notes, which repeat the
    # program, stay behind with its exception: the program is printed once, as a test.
    request.node.stash[FAILING_PROGRAM] = failed[-1]
    backend = dict(request.node.user_properties).get("ptn_backend", ptn_backend.name)
    program = reproducer(failed[-1])
    pytest.fail(
        f"{message}\n\nthe program, as a test (run with --ptn-backend={backend}):\n\n{program}", pytrace=False
    )
