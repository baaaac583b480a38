"""A slow probe of this environment (does an ``ext:`` flow lower here?) runs once per environment: its result
is kept in the user's cache with the versions and PATH it depends on, and probed again when they change."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ptn.backends import probe_cache


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "probes"
    monkeypatch.setenv(probe_cache.CACHE_ENV, str(folder))
    return folder


class Probe:
    """Counts its runs; says what it was told to."""

    def __init__(self, found: str | None):
        self.found, self.runs = found, 0

    def __call__(self) -> str | None:
        self.runs += 1
        return self.found


@pytest.mark.parametrize("found", ["RuntimeError: Unable to locate a model converter", None])
def test_a_probe_runs_once_per_environment_and_again_when_it_changes(cache: Path, found: str | None) -> None:
    """None (the flow lowers) is kept too. Before: every ``list backends`` lowered each such flow again."""
    probe = Probe(found)
    here = {"executorch": "1.5.1", "PATH": "/usr/bin"}
    assert probe_cache.remembered("lowers-ext-x", here, probe) == found
    assert probe_cache.remembered("lowers-ext-x", dict(here), probe) == found
    assert probe.runs == 1
    assert probe_cache.remembered("lowers-ext-x", {**here, "executorch": "1.6.0"}, probe) == found
    assert probe.runs == 2
    assert probe_cache.remembered("lowers-ext-y", {**here, "executorch": "1.6.0"}, probe) == found
    assert probe.runs == 3, "each probe is kept under its own name"
    assert sorted(p.name for p in cache.iterdir()) == ["lowers-ext-x.json", "lowers-ext-y.json"]


def test_an_executable_installed_on_path_changes_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Arm's VGF flow looks for its model converter on PATH: installing it into a folder already there must
    probe again, though no version and not PATH itself changed."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", str(folder))
    before = probe_cache.environment(["pytest"])
    assert before["pytest"] == pytest.__version__
    assert probe_cache.environment(["no-such-distribution-for-ptn"])["no-such-distribution-for-ptn"] == (
        "not installed"
    )
    (folder / "model-converter").write_text("#!/bin/sh\n")
    assert probe_cache.environment(["pytest"]) != before


def test_a_cache_that_cannot_be_read_or_written_is_probed_past(cache: Path) -> None:
    probe = Probe("found")
    cache.mkdir()
    (cache / "lowers-ext-x.json").write_text("{not json")
    assert probe_cache.remembered("lowers-ext-x", {}, probe) == "found"
    assert probe_cache.remembered("lowers-ext-x", {}, probe) == "found"
    assert probe.runs == 1, "a broken file is replaced by the probe's result"
    (cache / "lowers-ext-x.json").unlink()
    cache.rmdir()
    cache.write_text("a file where the folder should be")
    assert probe_cache.remembered("lowers-ext-x", {}, probe) == "found"
    assert probe.runs == 2
    assert cache.read_text() == "a file where the folder should be"


def test_a_probe_that_runs_is_announced_and_a_kept_one_is_not(cache: Path) -> None:
    """``list backends`` names each probe as it starts: the slow step a user waits for."""
    told: list[str] = []
    probe = Probe("found")
    with probe_cache.announced(told.append):
        probe_cache.remembered("lowers-ext-x", {}, probe)
        probe_cache.remembered("lowers-ext-x", {}, probe)
    probe_cache.remembered("lowers-ext-y", {}, probe)
    assert told == ["lowers-ext-x"]
    assert probe.runs == 2
