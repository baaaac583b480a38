"""A damaged AOTI compile cache costs one recompile, never a failed lowering or a crashed process.

One real compile per module (the smallest program that keeps a constant out of the code); every test
copies its entry into a cache of its own and damages it. Recompiles there copy the compiled .so and blob
in place of inductor (the rest of the compile path runs as is), so the file costs one compile, not one per
test.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_ptn.backends.aoti import cache as aoti_cache
from pytest_ptn.backends.aoti.backend import AotiBackend, AotiLowered
from pytest_ptn.backends.aoti.cache import CACHE_ENV, MANIFEST, CompiledMethod
from pytest_ptn.programs.build import Program
from pytest_ptn.spec import Constant, Method, ProgramSpec

pytestmark = pytest.mark.skipif(
    not AotiBackend.availability().available, reason=AotiBackend.availability().reason
)

SMALLEST = Program(
    ProgramSpec(methods=(Method("m", (Constant("w", "parameter", shape=(16,), seed=1),), reads=("w",)),))
)
"""One method, one constant too large for inductor to inline: every file of an entry has bytes."""

HOURS_AGO = time.time() - 2 * 3600


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> CompiledMethod:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("aoti-cache")))
        lowered = AotiBackend().lower(SMALLEST.export(), tmp_path_factory.mktemp("lowered"))
    return lowered.methods["m"]


@dataclass
class Cache:
    entry: Path
    """The copy of the pristine entry, where a lowering of SMALLEST looks."""
    compiles: list[Path]
    """Output folder of every compile made since."""
    workdir: Path

    def lower(self) -> AotiLowered:
        return AotiBackend().lower(SMALLEST.export(), self.workdir)


@pytest.fixture
def cache(pristine: CompiledMethod, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cache:
    root = tmp_path / "cache"
    entry = root / pristine.dir.parent.name / pristine.dir.name
    shutil.copytree(pristine.dir, entry)
    monkeypatch.setenv(CACHE_ENV, str(root))
    compiles: list[Path] = []

    def aot_compile(module: object, examples: object, *, options: dict[str, Any]) -> list[str]:
        out = Path(options["aot_inductor.output_path"])
        out.mkdir(parents=True)
        so, blob = out / "m.wrapper.so", out / "m_weights.blob"
        shutil.copy(pristine.so, so)
        shutil.copy(pristine.blob, blob)
        compiles.append(out)
        return [str(so), str(blob)]

    monkeypatch.setattr(torch._inductor, "aot_compile", aot_compile)
    (tmp_path / "lowered").mkdir()
    return Cache(entry, compiles, tmp_path / "lowered")


def _outputs_match(lowered: AotiLowered) -> bool:
    loaded = AotiBackend().load(lowered)
    return all(
        torch.allclose(loaded.run(call.method, list(call.inputs))[0], call.outputs[0], atol=1e-5)
        for call in SMALLEST.eager()
    )


def test_a_sound_entry_is_used_as_is(cache: Cache) -> None:
    """The copies the other tests damage are found where a lowering looks: their recompiles are repairs."""
    lowered = cache.lower()
    assert cache.compiles == [] and lowered.methods["m"].dir == cache.entry
    assert _outputs_match(lowered)


def _empty_manifest(entry: Path) -> None:
    (entry / MANIFEST).write_text("")


def _truncated_so(entry: Path) -> None:
    """What a partly restored cache holds: mapping it raises SIGBUS, which ends the whole run."""
    os.truncate(entry / "model.wrapper.so", 4096)


def _corrupted_so(entry: Path) -> None:
    so = entry / "model.wrapper.so"
    data = bytearray(so.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    so.write_bytes(bytes(data))


def _missing_weights(entry: Path) -> None:
    (entry / "weights.bin").unlink()


def _manifest_without_sizes(entry: Path) -> None:
    manifest = json.loads((entry / MANIFEST).read_text())
    del manifest["files"]
    (entry / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_empty_manifest, "manifest.json is unreadable (JSONDecodeError"),
        (_truncated_so, "model.wrapper.so has 4096 B, the manifest records"),
        (_corrupted_so, "model.wrapper.so does not have the sha256 the manifest records"),
        (_missing_weights, "weights.bin is missing"),
        (_manifest_without_sizes, "manifest.json is malformed (KeyError: 'files')"),
    ],
    ids=["empty-manifest", "truncated-so", "corrupted-so", "missing-file", "no-sizes"],
)
def test_a_damaged_entry_is_recompiled_once_with_a_warning(
    cache: Cache, damage: Any, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    damage(cache.entry)
    with caplog.at_level(logging.WARNING, logger=aoti_cache.__name__):
        lowered = cache.lower()
    assert len(cache.compiles) == 1 and lowered.methods["m"].dir == cache.entry  # before anything loads it
    [warning] = [r.getMessage() for r in caplog.records if r.name == aoti_cache.__name__]
    assert warning.startswith(f"AOTI cache entry {cache.entry}: {reason}"), warning
    assert warning.endswith("; discarded, compiling it again"), warning
    assert _outputs_match(lowered)
    assert [p.name for p in cache.entry.parent.iterdir()] == [cache.entry.name]  # no temporary left
    cache.lower()
    assert len(cache.compiles) == 1  # repaired on disk


def test_entries_are_synced_before_they_are_published(cache: Cache, monkeypatch: pytest.MonkeyPatch) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("names synced descriptors through /proc/self/fd")
    synced: list[Path] = []
    fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    shutil.rmtree(cache.entry)
    cache.lower()
    shard = cache.entry.parent.resolve()
    temporaries = {p.parent for p in synced if p.parent.parent == shard}
    assert len(temporaries) == 1, synced  # every file synced under its temporary name: before the rename
    tmp = temporaries.pop()
    assert tmp.name.startswith(".tmp-")
    assert {p.name for p in synced if p.parent == tmp} == {MANIFEST, *aoti_cache.FILES}
    assert synced[-2:] == [tmp, shard]  # the folder before the rename, its parent after


def test_a_compile_removes_abandoned_temporaries_and_keeps_live_ones(cache: Cache) -> None:
    shard, other = cache.entry.parent, cache.entry.parents[1] / "zz"
    other.mkdir()
    killed = shard / ".tmp-killed"  # its process died holding the lock: the kernel released it
    killed.mkdir()
    (killed / ".lock").touch()
    old = other / ".tmp-old"  # no lock: left by an older pytest-ptn, or a discarded entry half removed
    old.mkdir()
    os.utime(old, (HOURS_AGO, HOURS_AGO))
    young = other / ".tmp-young"  # no lock yet: being created this instant
    young.mkdir()
    with aoti_cache.compile_folder(other) as live:
        os.utime(live, (HOURS_AGO, HOURS_AGO))  # a long compile: its lock, not its age, keeps it
        shutil.rmtree(cache.entry)
        cache.lower()
        assert len(cache.compiles) == 1
        assert sorted(p.name for p in other.iterdir()) == sorted([live.name, young.name])
        assert [p.name for p in shard.iterdir()] == [cache.entry.name]
