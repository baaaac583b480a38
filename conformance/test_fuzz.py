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
    ptn_backend: Backend,
    ptn_fuzz: Callable[[Callable[..., None]], Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from hypothesis import given, note

    from pytest_ptn.harness import check_spec
    from pytest_ptn.spec import ProgramSpec
    from pytest_ptn.strategies import program_specs, reproducer

    @ptn_fuzz
    @given(program_specs())
    def check(spec: ProgramSpec) -> None:
        note(f"reproducer:\n{reproducer(spec)}")
        mismatches = check_spec(ptn_backend, spec, tmp_path_factory.mktemp("fuzz"))
        assert not mismatches, "\n".join(str(m) for m in mismatches)

    check()
