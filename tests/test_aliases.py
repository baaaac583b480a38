"""One tensor reachable by several FQNs (a submodule on several paths) is one constant: no false S1 or P4."""

from __future__ import annotations

import pytest

from pytest_ptn.plugin import suite_path
from pytest_ptn.programs.build import Program
from pytest_ptn.programs.catalogue import BY_NAME
from pytest_ptn.programs.exported import aliases


def test_second_fqns_are_aliases_of_the_first() -> None:
    for ep in Program(BY_NAME["aliased_submodule"].spec).export().values():
        assert aliases(ep) == {"rope.w": "shared.w", "rope.freqs": "shared.freqs"}


def test_unallocated_second_names_are_no_s1(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess(
        str(suite_path()),
        "--ptn-backend=broken_backends:UsedNamesOnly",
        "-k",
        "aliased_submodule",
        "-m",
        "S1 or S5 or P4",
        "-p",
        "no:cacheprovider",
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) == 3 and not outcomes.get("failed"), outcomes


def test_a_real_split_of_an_aliased_tensor_is_still_s1(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess(
        str(suite_path()),
        "--ptn-backend=broken_backends:NoSharing",
        "-k",
        "aliased_submodule",
        "-m",
        "S1",
        "-p",
        "no:cacheprovider",
    )
    assert result.parseoutcomes().get("failed", 0) == 1
