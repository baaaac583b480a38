"""The lookalike scenarios (catalogue.LOOKALIKE) catch loaders that share on less than the full content: each
broken cache fails S2 (the storage check, not only the outputs) and E1 on the scenario made for it, and the
reference backend passes them all."""

from __future__ import annotations

import re

import pytest
from broken_backends import ClosenessDedupe, DtypeBlindDedupe, PrefixDigestCache

from pytest_ptn.plugin import suite_path
from pytest_ptn.programs.catalogue import LOOKALIKE, tagged

SCENARIOS = (
    "zero_caches_two_dtypes",
    "near_equal_weights",
    "equal_bytes_two_dtypes",
    "close_weights",
    "equal_bytes_two_shapes",
    "reordered_weights",
)

CAUGHT = {
    DtypeBlindDedupe: {
        "zero_caches_two_dtypes": "'pad_mask' shares storage with method 'prefill''s 'attn_bias'",
        "equal_bytes_two_dtypes": "'norm_gain_bits' shares storage with method 'encode''s 'norm_gain'",
    },
    PrefixDigestCache: {
        "near_equal_weights": "'tuned_proj' shares storage with method 'prefill''s 'base_proj'"
    },
    ClosenessDedupe: {
        "near_equal_weights": "'tuned_embed' shares storage with method 'prefill''s 'base_embed'",
        "close_weights": "'tuned.weight' shares storage with method 'prefill''s 'base.weight'",
    },
}
"""Variant -> the scenarios it fails (E1 and S2, nothing else) -> a storage finding S2 reports there."""

TESTS = {"E1": "test_each_method_matches_eager", "S2": "test_lookalike_content_is_never_shared"}


def test_every_lookalike_scenario_is_tagged() -> None:
    assert sorted(s.name for s in tagged(LOOKALIKE)) == sorted(SCENARIOS)


def test_lookalike_scenarios_catch_partial_content_keys(pytester: pytest.Pytester, warm_torch: None) -> None:
    """One run, all four backends: E1 under the up-front schedule only (the at-first-call one binds the same
    way through these caches, and doubled the time)."""
    backends = ["reference", *(f"broken_backends:{v.__name__}" for v in CAUGHT)]
    result = pytester.runpytest_inprocess(
        str(suite_path()),
        *(f"--ptn-backend={b}" for b in backends),
        "-m",
        "E1 or S2",
        "-k",
        f"({' or '.join(SCENARIOS)}) and not at_first_call",
        "-p",
        "no:cacheprovider",
    )
    failed = {
        (m[1], m[2], m[3])
        for line in result.outlines
        if (m := re.match(r"FAILED \S+::(\w+)\[([^\]]+?)-(\w+)(?:-up_front)?\]", line))
    }
    want = {
        (TESTS[rule], f"broken_backends:{variant.__name__}", scenario)
        for variant, scenarios in CAUGHT.items()
        for scenario in scenarios
        for rule in TESTS
    }
    assert failed == want, sorted(failed ^ want)
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) == len(backends) * len(SCENARIOS) * len(TESTS) - len(want), outcomes
    result.stdout.fnmatch_lines_random(
        [f"*S2: method 'decode': key {finding}, *" for found in CAUGHT.values() for finding in found.values()]
    )
