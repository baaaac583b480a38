"""P rules: how a package names, stores and shares the constants of a multi-method program."""

from __future__ import annotations

import math
import time

import pytest

from pytest_ptn.check.package import (
    dedupe_findings,
    namespace_findings,
    reference_findings,
    state_alias_findings,
)
from pytest_ptn.harness import Case, fail_with
from pytest_ptn.programs.exported import constants_of

pytestmark = pytest.mark.ptn_scenarios("valid")

ZIP_TIME_STEP = 2
"""The resolution of a zip member's timestamp, in seconds: stamps in one even-second step are equal."""


@pytest.mark.P1
def test_immutable_constants_live_in_their_method_namespace(ptn_case: Case) -> None:
    view = ptn_case.lower().package()
    wrong = [str(f) for f in namespace_findings(view, ptn_case.exported()) if f.rule == "P1"]
    fail_with(wrong)


@pytest.mark.P2
def test_mutated_keys_are_one_state_entry(ptn_case: Case) -> None:
    view = ptn_case.lower().package()
    wrong = [str(f) for f in namespace_findings(view, ptn_case.exported()) if f.rule == "P2"]
    fail_with(wrong)


@pytest.mark.P3
def test_every_reference_is_rewritten_and_resolves(ptn_case: Case) -> None:
    wrong = [str(f) for f in reference_findings(ptn_case.lower().package())]
    fail_with(wrong)


@pytest.mark.P4
def test_identical_immutable_tensors_are_stored_once(ptn_case: Case) -> None:
    view = ptn_case.lower().package()
    programs = ptn_case.exported()
    wrong = [str(f) for f in dedupe_findings(view, programs)]
    fail_with(wrong)
    for method, ep in programs.items():
        for key, use in constants_of(ep).items():
            final = view.bindings[method].get(key)
            assert final is not None, f"method {method!r}: key {key!r} has no binding in the package"
            if not final.startswith("state/"):
                assert view.read(final).equal(use.tensor), (
                    f"{final!r} does not hold method {method!r} key {key!r}"
                )


@pytest.mark.P5
def test_state_is_never_an_alias(ptn_case: Case) -> None:
    wrong = [str(f) for f in state_alias_findings(ptn_case.lower().package())]
    fail_with(wrong)


@pytest.mark.P9
def test_lowering_twice_gives_identical_packages(ptn_case: Case) -> None:
    lowered = ptn_case.lower()
    first = lowered.path.read_bytes()
    # A package that embeds the time must show it, whatever the timing of the run: zip stamps members in
    # 2-second steps, so the second lowering starts in a later step than the one the first package ended in.
    written = lowered.path.stat().st_mtime
    next_step = (math.floor(written / ZIP_TIME_STEP) + 1) * ZIP_TIME_STEP
    time.sleep(max(0.0, next_step - time.time() + 0.01))
    second = ptn_case.lower_fresh().path.read_bytes()
    assert first == second, f"two lowerings differ ({len(first)} vs {len(second)} bytes)"
