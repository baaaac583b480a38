"""``--ptn-shard=K/N``: shards that split the cases between them and merge into the unsharded matrix."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from pytest_ptn.cli.main import main as ptn_cli
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
        f"ERROR: --ptn-shard={value}: expected K/N with whole numbers 1 <= K <= N (or auto), "
        "e.g. --ptn-shard=2/3"
    )


def test_tests_outside_any_case_are_split_too(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also as GitLab's ``parallel: 3`` jobs give them (``--ptn-shard=auto``, CI_NODE_INDEX from 1)."""
    pytester.makepyfile(PLAIN_TESTS)
    ran: list[str] = []
    monkeypatch.setenv("CI_NODE_TOTAL", "3")
    for k in (1, 2, 3):
        monkeypatch.setenv("CI_NODE_INDEX", str(k))
        result = pytester.runpytest(f"--ptn-shard={k}/3" if k < 3 else "--ptn-shard=auto", "-v")
        header = (
            "(--ptn-shard)" if k < 3 else "(--ptn-shard=auto from GitLab CI (parallel:): CI_NODE_INDEX=3, *"
        )
        result.stdout.fnmatch_lines(
            [f"ptn: shard {k}/3 {header}*", f"ptn shard {k}/3: 0 * and * other tests*"]
        )
        ran += [line.split()[0] for line in result.stdout.lines if " PASSED" in line]
    assert sorted(ran) == sorted(
        f"test_tests_outside_any_case_are_split_too.py::test_plain[{n}]" for n in range(7)
    )


def test_three_shards_merge_into_the_unsharded_matrix(
    pytester: pytest.Pytester,
    warm_torch: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As the pods of a Kubernetes Indexed Job run them (``--ptn-shard=auto``), and as the merge job finds
    them: every shard there, or one missing."""
    # total_collision: S2 and S3; the float32 scenarios only
    three_cases = (
        "(colliding_literals or colliding_scalars or total_collision) and not in_bf16 and not in_fp16"
    )
    common = ["--ptn-backend=reference", "-m", "S2 or S3", "-k", three_cases]
    assert pytester.runpytest(*common, "--ptn-report", str(tmp_path / "full")).ret == 0
    full = results.load(tmp_path / "full" / "results.json")
    monkeypatch.setenv("PTN_SHARD_TOTAL", "3")
    for k in (1, 2, 3):
        monkeypatch.setenv("JOB_COMPLETION_INDEX", str(k - 1))
        outcome = pytester.runpytest(*common, "--ptn-shard=auto", "--ptn-report", str(tmp_path / f"shard{k}"))
        assert outcome.ret == 0
        outcome.stdout.fnmatch_lines(
            [
                f"ptn: shard {k}/3 (--ptn-shard=auto from Kubernetes Indexed Job: "
                f"JOB_COMPLETION_INDEX={k - 1}, PTN_SHARD_TOTAL=3)*",
                f"ptn shard {k}/3: 1 (backend, scenario) cases and 0 other tests*",
            ]
        )
        run = results.load(tmp_path / f"shard{k}" / "results.json").run
        assert run is not None and run.complete and run.shard == f"{k}/3" and run.finished == run.selected
    shard_files = [str(tmp_path / f"shard{k}" / "results.json") for k in (1, 2, 3)]
    assert ptn_cli(["report", "merge", *shard_files, "-o", str(tmp_path / "merged")]) == 0

    merged = results.load(tmp_path / "merged" / "results.json")
    assert merged.results == full.results
    assert merged.run == full.run == results.RunStatus(len(full.results), len(full.results))
    capsys.readouterr()
    assert ptn_cli(["report", "merge", shard_files[0], shard_files[2], "-o", str(tmp_path / "two")]) == 0
    assert "INCOMPLETE: " in capsys.readouterr().out
    two = results.load(tmp_path / "two" / "results.json")
    assert two.run is not None and two.run.stopped == "shard 2/3 missing"
    assert "; shard 2/3 missing" in (tmp_path / "two" / "summary.md").read_text()
    shard_of_case: dict[tuple[str, str | None], set[int]] = {}
    for k in (1, 2, 3):
        for row in results.load(tmp_path / f"shard{k}" / "results.json").results:
            shard_of_case.setdefault((row.backend, row.scenario), set()).add(k)
    assert all(len(where) == 1 for where in shard_of_case.values())  # total_collision's S2 and S3 together


@pytest.mark.parametrize(
    ("env", "shard"),
    [
        ({"CI_NODE_INDEX": "1", "CI_NODE_TOTAL": "4"}, "1/4"),
        ({"CIRCLE_NODE_INDEX": "0", "CIRCLE_NODE_TOTAL": "2"}, "1/2"),
        ({"BUILDKITE_PARALLEL_JOB": "4", "BUILDKITE_PARALLEL_JOB_COUNT": "5"}, "5/5"),
        ({"SYSTEM_JOBPOSITIONINPHASE": "2", "SYSTEM_TOTALJOBSINPHASE": "3"}, "2/3"),
        ({"SEMAPHORE_JOB_INDEX": "3", "SEMAPHORE_JOB_COUNT": "3"}, "3/3"),
        ({"BITBUCKET_PARALLEL_STEP": "1", "BITBUCKET_PARALLEL_STEP_COUNT": "2"}, "2/2"),
        ({"JOB_COMPLETION_INDEX": "2", "PTN_SHARD_TOTAL": "8"}, "3/8"),
        (
            {"CI_NODE_INDEX": "2", "CI_NODE_TOTAL": "2", "CIRCLE_NODE_INDEX": "1", "CIRCLE_NODE_TOTAL": "2"},
            "2/2",
        ),
    ],
)
def test_auto_reads_each_ci_systems_variables(env: dict[str, str], shard: str) -> None:
    assert str(shards.from_environment({"PATH": "/bin", **env})[0]) == shard


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {},
            "no CI parallel-job variables here (looked for GitLab CI (parallel:) CI_NODE_INDEX/*",
        ),
        (
            {"JOB_COMPLETION_INDEX": "0"},
            "Kubernetes Indexed Job: * PTN_SHARD_TOTAL is not (set it to the Job's*",
        ),
        ({"CI_NODE_TOTAL": "1"}, "GitLab CI (parallel:): CI_NODE_TOTAL is set but CI_NODE_INDEX is not*"),
        (
            {"CI_NODE_INDEX": "0", "CI_NODE_TOTAL": "2"},
            "*CI_NODE_INDEX=0, CI_NODE_TOTAL=2: the index must be 1..2",
        ),
        ({"CIRCLE_NODE_INDEX": "x", "CIRCLE_NODE_TOTAL": "2"}, "*: expected whole numbers"),
        (
            {"CI_NODE_INDEX": "1", "CI_NODE_TOTAL": "2", "CIRCLE_NODE_INDEX": "1", "CIRCLE_NODE_TOTAL": "2"},
            "*disagree*",
        ),
    ],
)
def test_auto_without_a_clear_shard_is_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    """Never a silent 1/1: that would run the whole suite on every one of the N jobs."""
    for ci in shards.CI_SHARDS:
        monkeypatch.delenv(ci.index, raising=False)
        monkeypatch.delenv(ci.total, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    pytester.makepyfile(PLAIN_TESTS)
    result = pytester.runpytest("--ptn-shard=auto")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --ptn-shard=auto: {message}"])
