"""The suite in a backend team's CI as they run it: pytest-cov, pytest-randomly and pytest-timeout beside the
default crash isolation (one xdist worker).

pytest-cov chooses when pytest starts between measuring its own process and combining what xdist workers
measured. The plugin makes a conformance run distributed before that choice (plugin.pytest_load_initial_
conftests); made after it, the run ended at once: ``INTERNALERROR> AttributeError: 'Central' object has no
attribute 'configure_node'``.
"""

from __future__ import annotations

import re

import pytest

SLICE = "test_each_method_matches_eager and single_method"
"""Two tests (one per load schedule) that lower, load and run in the worker: little to pay for a worker."""


def test_coverage_shuffled_order_and_timeouts_with_crash_isolation(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From an empty folder: the tests pass, in an order pytest-randomly chose, under pytest-timeout's limit,
    and the coverage report counts what the worker ran (the harness runs only there)."""
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:randomly")  # as this project's addopts: `-p randomly` wins
    result = pytester.runpytest_subprocess(
        "--ptn-backend=reference",
        "--cov=pytest_ptn",
        "--timeout=300",
        "-p",
        "randomly",
        "-k",
        SLICE,
        "-p",
        "no:cacheprovider",
    )
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out
    assert {k: n for k, n in result.parseoutcomes().items() if k != "deselected"} == {"passed": 2}, out
    result.stdout.re_match_lines(
        [r"Using --randomly-seed=\d+", r"ptn: crash isolation on: .*", r"timeout: 300\.0s"]
    )
    assert re.search(r"^TOTAL\s+\d+\s+\d+\s+\d+%$", out, re.M), out
    harness = re.search(r"pytest_ptn/harness\.py\s+(\d+)\s+(\d+)\s", out)
    assert harness is not None, out
    statements, missed = map(int, harness.groups())
    assert missed < statements, harness[0]
