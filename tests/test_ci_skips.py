""".ci/skips.py, which fails CI on a skip of this project's tests that no run of CI passed and the allow-list
(.ci/allowed-skips.toml) does not give a reason for."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

CI = Path(__file__).parents[1] / ".ci"


@pytest.fixture(scope="module")
def skips() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("ci_skips", CI / "skips.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks its module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def junit(path: Path, *cases: str) -> Path:
    """A JUnit XML file as pytest writes it, with ``cases`` (``<testcase>`` elements) in it."""
    suite = f'<testsuite name="pytest">{"".join(cases)}</testsuite>'
    path.write_text(f'<?xml version="1.0"?><testsuites>{suite}</testsuites>')
    return path


def case(name: str, outcome: str = "") -> str:
    return f'<testcase classname="tests.test_x" name="{name}" time="0.1">{outcome}</testcase>'


def skipped(reason: str) -> str:
    return f'<skipped type="pytest.skip" message="{reason}">tests/test_x.py:3: {reason}</skipped>'


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    path = tmp_path / "allowed.toml"
    path.write_text("[[skip]]\nreason = '^no GPU here$'\nwhy = 'CI has no GPU'\n")
    return path


def test_an_unlisted_skip_fails_naming_it(
    skips: ModuleType, tmp_path: Path, allowed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chromium = skipped("chromium is not installed")
    report = junit(tmp_path / "readme.xml", case("test_a"), case("test_b", chromium))
    assert skips.main([str(report), "--allowed", str(allowed)]) == 1
    out = capsys.readouterr().out
    assert "chromium is not installed\n    -> NOT ALLOWED" in out
    assert "tests.test_x::test_b (readme.xml)" in out


def test_a_listed_skip_passes_with_its_reason(
    skips: ModuleType, tmp_path: Path, allowed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = junit(tmp_path / "readme.xml", case("test_a", skipped("no GPU here")))
    assert skips.main([str(report), "--allowed", str(allowed)]) == 0
    assert "no GPU here\n    -> allowed: CI has no GPU" in capsys.readouterr().out


def test_a_skip_another_run_passed_is_no_skip_of_ci(
    skips: ModuleType, tmp_path: Path, allowed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's tests skip what needs an extra; the run with the extra passes it."""
    readme = junit(tmp_path / "readme.xml", case("test_arm", skipped("needs the arm extra")))
    arm = junit(tmp_path / "arm.xml", case("test_arm"))
    assert skips.main([str(readme), str(arm), "--allowed", str(allowed)]) == 0
    assert "needs the arm extra\n    -> ran elsewhere (arm.xml)" in capsys.readouterr().out
    # skipped there too, or failed there: it ran nowhere
    for outcome in (skipped("needs the arm extra"), '<failure message="boom"/>'):
        junit(arm, case("test_arm", outcome))
        assert skips.main([str(readme), str(arm), "--allowed", str(allowed)]) == 1


def test_an_xfail_is_not_a_skip(skips: ModuleType, tmp_path: Path, allowed: Path) -> None:
    report = junit(tmp_path / "r.xml", case("test_a", '<skipped type="pytest.xfail" message="known bug"/>'))
    assert skips.main([str(report), "--allowed", str(allowed)]) == 0


def test_a_missing_report_fails(skips: ModuleType, tmp_path: Path, allowed: Path) -> None:
    assert skips.main([str(tmp_path / "arm.xml"), "--allowed", str(allowed)]) == 1


def test_the_repositorys_allow_list_says_why_for_each_entry(skips: ModuleType) -> None:
    entries = skips.load_allowed(skips.ALLOWED)
    assert entries and all(len(entry.why) > 20 for entry in entries)
