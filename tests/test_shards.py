"""``--ptn-shard=K/N``: shards that split the cases between them and merge into the unsharded matrix."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from pytest_ptn.__main__ import main as ptn_cli
from pytest_ptn.reporting import results
from pytest_ptn.scheduling import shards

PLAIN_TESTS = """
import pytest

@pytest.mark.parametrize("n", range(7))
def test_plain(n):
    pass
"""


def test_units_are_dealt_evenly_and_deterministically() -> None:
    units = {f"case{i}": size for i, size in enumerate([9, 1, 4, 4, 2, 7, 1, 3, 5, 6])}
    dealt = shards.assign(units, 3)
    assert dealt == shards.assign(dict(reversed(units.items())), 3)  # collection order does not matter
    assert set(dealt) == set(units)
    per_shard = Counter(dealt.values())
    assert sorted(per_shard) == [0, 1, 2] and max(per_shard.values()) - min(per_shard.values()) <= 1
    tests = Counter()
    for unit, shard in dealt.items():
        tests[shard] += units[unit]
    assert max(tests.values()) - min(tests.values()) <= 3  # the smallest unit dealt last evens them out


@pytest.mark.parametrize("value", ["0/3", "4/3", "1/0", "2", "a/b", "-1/3"])
def test_a_bad_shard_is_a_one_line_usage_error(pytester: pytest.Pytester, value: str) -> None:
    pytester.makepyfile(PLAIN_TESTS)
    result = pytester.runpytest(f"--ptn-shard={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.str().strip() == (
        f"ERROR: --ptn-shard={value}: expected K/N with whole numbers 1 <= K <= N, e.g. --ptn-shard=2/3"
    )


def test_tests_outside_any_case_are_split_too(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(PLAIN_TESTS)
    ran: list[str] = []
    for k in (1, 2, 3):
        result = pytester.runpytest(f"--ptn-shard={k}/3", "-v")
        result.stdout.fnmatch_lines(
            [f"ptn: shard {k}/3 (--ptn-shard)*", f"ptn shard {k}/3: 0 * and * other tests*"]
        )
        ran += [line.split()[0] for line in result.stdout.lines if " PASSED" in line]
    assert sorted(ran) == sorted(
        f"test_tests_outside_any_case_are_split_too.py::test_plain[{n}]" for n in range(7)
    )


def test_three_shards_merge_into_the_unsharded_matrix(
    pytester: pytest.Pytester, warm_torch: None, tmp_path: Path
) -> None:
    three_cases = "colliding_literals or colliding_scalars or total_collision"  # total_collision: S2 and S3
    common = ["--ptn-backend=reference", "-m", "S2 or S3", "-k", three_cases]
    assert pytester.runpytest(*common, "--ptn-report", str(tmp_path / "full")).ret == 0
    full = results.load(tmp_path / "full" / "results.json").results
    for k in (1, 2, 3):
        outcome = pytester.runpytest(
            *common, f"--ptn-shard={k}/3", "--ptn-report", str(tmp_path / f"shard{k}")
        )
        assert outcome.ret == 0
        outcome.stdout.fnmatch_lines([f"ptn shard {k}/3: 1 (backend, scenario) cases and 0 other tests*"])
    shard_files = [str(tmp_path / f"shard{k}" / "results.json") for k in (1, 2, 3)]
    assert ptn_cli(["report", "merge", *shard_files, "-o", str(tmp_path / "merged")]) == 0

    assert results.load(tmp_path / "merged" / "results.json").results == full
    shard_of_case: dict[tuple[str, str | None], set[int]] = {}
    for k in (1, 2, 3):
        for row in results.load(tmp_path / f"shard{k}" / "results.json").results:
            shard_of_case.setdefault((row.backend, row.scenario), set()).add(k)
    assert all(len(where) == 1 for where in shard_of_case.values())  # total_collision's S2 and S3 together
