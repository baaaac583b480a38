"""conformance/gpu/nightly.sh and what it relies on to run from a source checkout with nothing installed (an
air-gapped GPU runner): the plugin loaded with ``-p``, backends found by name without entry points."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from pytest_ptn import backend
from pytest_ptn.backend import ENTRY_POINT_GROUP, PROJECT_BACKENDS, installed_backends, resolve_backend
from pytest_ptn.backends.reference import ReferenceBackend

ROOT = Path(__file__).parents[1]
NIGHTLY = ROOT / "conformance" / "gpu" / "nightly.sh"


def test_the_fallback_table_is_pyprojects_entry_points() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][ENTRY_POINT_GROUP] == PROJECT_BACKENDS


def test_backends_resolve_by_name_when_the_distribution_is_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    other = importlib.metadata.EntryPoint("other", "elsewhere:Backend", ENTRY_POINT_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [other])
    monkeypatch.setattr(backend, "package_version", lambda dist: None)
    found = installed_backends()
    assert set(found) == {*PROJECT_BACKENDS, "other"}
    assert resolve_backend("reference") is ReferenceBackend


def test_installed_entry_points_alone_when_the_distribution_is_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [])
    monkeypatch.setattr(backend, "package_version", lambda dist: "1.0")
    assert installed_backends() == {}


def nightly(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable, "PTN_AOTI_CACHE": str(out / "cache")}
    return subprocess.run(
        ["bash", str(NIGHTLY), str(out), *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_gpu_run_without_a_gpu_stops_before_running(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    run = nightly(tmp_path)
    assert run.returncode != 0
    assert "sees no GPU" in run.stderr
    assert not (tmp_path / "results.json").exists()


def test_the_cpu_run_selects_both_aoti_backends_from_the_checkout(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = nightly(out, "--device", "cpu", "--collect-only", "-q")
    assert run.returncode == 0, run.stdout + run.stderr
    collected = [line for line in run.stdout.splitlines() if "::" in line]
    assert collected and all("colliding" in c or "shared_weight" in c for c in collected)
    assert any("[aoti-colliding_literals]" in c for c in collected)
    assert any("[aoti-upstream-shared_weight]" in c for c in collected)
    assert f"AOTI cache {out / 'cache'}" in run.stderr


MERGE = ROOT / "conformance" / "gpu" / "merge.sh"


def merge_shards(tmp_path: Path, *dirs: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(MERGE), str(tmp_path / "merged"), *map(str, dirs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_merge_job_renders_a_killed_shard_and_names_a_missing_one(tmp_path: Path) -> None:
    """As the nightly matrix's merge job sees it: shard 1 finished, shard 2 was killed (its stream only),
    shard 3 left nothing."""
    from pytest_ptn.reporting import results, stream
    from pytest_ptn.ruleset import SPEC_VERSION

    def row(nodeid: str) -> results.Result:
        return results.Result("E1", "MUST", "kv_cache", "aoti", "pass", "", "pytest x", None, nodeid)

    shard1, shard2, shard3 = (tmp_path / f"shard-{k}" for k in (1, 2, 3))
    shard1.mkdir()
    shard2.mkdir()
    results.save(
        results.Results(SPEC_VERSION, {}, [row("t::a")], run=results.RunStatus(1, 1, None, "1/3")),
        shard1 / "results.json",
    )
    killed = stream.VerdictStream(shard2 / stream.NAME, SPEC_VERSION, {}, "2/3")
    killed.selected(2)
    killed.test("t::b", [row("t::b")])

    merged = merge_shards(tmp_path, shard1, shard2, shard3)
    assert merged.returncode == 1, merged.stderr
    assert f"merge: {shard3} holds no report" in merged.stderr
    headline = "INCOMPLETE: 2 tests finished; shard 3/3 missing; shard 2/3: the run ended without finishing"
    assert headline in merged.stdout
    assert headline in (tmp_path / "merged" / "summary.md").read_text()
    assert (shard2 / "results.json").exists()  # rendered from its stream
    assert {r.nodeid for r in results.load(tmp_path / "merged" / "results.json").results} == {"t::a", "t::b"}

    results.save(
        results.Results(SPEC_VERSION, {}, [row("t::b")], run=results.RunStatus(1, 1, None, "2/3")),
        shard2 / "results.json",
    )
    shard3.mkdir()
    results.save(
        results.Results(SPEC_VERSION, {}, [row("t::c")], run=results.RunStatus(1, 1, None, "3/3")),
        shard3 / "results.json",
    )
    assert merge_shards(tmp_path, shard1, shard2, shard3).returncode == 0
