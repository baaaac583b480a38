"""A damaged AOTI compile cache costs one recompile, never a failed lowering or a crashed process; a
program that differs from a compiled one only in the values of constants kept out of the code reuses its
.so, verified, and anything else compiles.

One real compile per module (the smallest program that keeps constants out of the code); every test copies
its entry into a cache of its own. Compiles there copy the compiled .so in place of inductor and write the
program's own bytes in the compiled blob's layout (the rest of the compile path runs as is), so the file
costs one compile, not one per test.
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
from pytest_ptn.backends.aoti import objects as aoti_objects
from pytest_ptn.backends.aoti.backend import AotiBackend, AotiLowered
from pytest_ptn.backends.aoti.cache import (
    CACHE_ENV,
    EXECUTORCH_OPTIONS,
    MANIFEST,
    STRUCTURES,
    CompiledMethod,
    structure_key,
)
from pytest_ptn.backends.aoti.objects import OBJECTS
from pytest_ptn.instruments.content import ContentKey, host_memory
from pytest_ptn.programs.build import Program
from pytest_ptn.programs.exported import constants_of, functionalize
from pytest_ptn.spec import Constant, Method, ProgramSpec

pytestmark = pytest.mark.skipif(
    not AotiBackend.availability().available, reason=AotiBackend.availability().reason
)


def smallest(seed: int, v_seed: int | None = None, bias: tuple[float, ...] = (0.5, 0.25)) -> Program:
    """One method; two constants too large for inductor to inline (every file of an entry has bytes, and
    two slots of one size can be swapped), one it inlines."""
    return Program(
        ProgramSpec(
            methods=(
                Method(
                    "m",
                    (
                        Constant("w", "parameter", shape=(16,), seed=seed),
                        Constant("v", "parameter", shape=(16,), seed=seed + 1 if v_seed is None else v_seed),
                        Constant("b", "parameter", shape=(2,), values=bias),
                    ),
                    reads=("w", "v", "b"),
                ),
            )
        )
    )


SMALLEST = smallest(1)
OTHER_VALUES = smallest(7)
"""SMALLEST with other bytes in the constants kept out of the code."""
OTHER_INLINED = smallest(1, bias=(2.0, 4.0))
"""SMALLEST with other values in the constant inductor inlines."""

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

    def lower(self, program: Program = SMALLEST) -> AotiLowered:
        return AotiBackend().lower(program.export(), self.workdir)


@pytest.fixture
def cache(pristine: CompiledMethod, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cache:
    root = tmp_path / "cache"
    entry = root / pristine.dir.parent.name / pristine.dir.name
    shutil.copytree(pristine.dir, entry)
    shutil.copytree(pristine.dir.parents[1] / STRUCTURES, root / STRUCTURES, symlinks=True)
    monkeypatch.setenv(CACHE_ENV, str(root))
    compiles: list[Path] = []

    def aot_compile(
        module: torch.nn.Module, examples: object, kwargs: object = None, *, options: dict[str, Any]
    ) -> list[str]:
        """What inductor gives for a program of SMALLEST's structure: its .so, and a blob of the module's
        own bytes where the pristine blob has SMALLEST's."""
        out = Path(options["aot_inductor.output_path"])
        out.mkdir(parents=True)
        so, blob = out / "m.wrapper.so", out / "m_weights.blob"
        shutil.copy(pristine.so, so)
        data = bytearray(pristine.blob.read_bytes())
        assert pristine.blob_offsets is not None
        for fqn, offset in pristine.blob_offsets.items():
            own = bytes(host_memory(module.get_parameter(fqn).detach()))
            data[offset : offset + len(own)] = own
        blob.write_bytes(data)
        compiles.append(out)
        return [str(so), str(blob)]

    monkeypatch.setattr(torch._inductor, "aot_compile", aot_compile)
    (tmp_path / "lowered").mkdir()
    return Cache(entry, compiles, tmp_path / "lowered")


def _outputs_match(lowered: AotiLowered, program: Program = SMALLEST) -> bool:
    loaded = AotiBackend().load(lowered)
    return all(
        torch.allclose(loaded.run(call.method, list(call.inputs))[0], call.outputs[0], atol=1e-5)
        for call in program.eager()
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


def _structure_key(program: Program) -> str:
    return structure_key(functionalize(program.export())["m"], EXECUTORCH_OPTIONS, "cpu")


def test_structure_keys_hold_what_reaches_the_code() -> None:
    """Bytes of constants kept out of the code do not; inlined values do, and so does which constants hold
    equal bytes (the container's constants are matched to keys by content)."""
    assert _structure_key(OTHER_VALUES) == _structure_key(SMALLEST)
    assert _structure_key(OTHER_INLINED) != _structure_key(SMALLEST)
    assert _structure_key(smallest(1, v_seed=1)) != _structure_key(SMALLEST)


def test_other_values_reuse_the_compiled_so(cache: Cache, pristine: CompiledMethod) -> None:
    """The .so compiled for SMALLEST, with a blob of the program's own bytes: no compile, and the entry holds
    exactly the program's constants (read back from a container) and computes its outputs."""
    lowered = cache.lower(OTHER_VALUES)
    method = lowered.methods["m"]
    assert cache.compiles == [] and method.dir != cache.entry
    assert method.so.read_bytes() == pristine.so.read_bytes()
    constants = constants_of(OTHER_VALUES.export()["m"])
    host = method.host_tensors()
    assert method.keys == {"w": "w", "v": "v"} and set(method.absent) == {"b"}
    for key, fqn in method.keys.items():
        assert ContentKey.of(host[fqn]) == ContentKey.of(constants[key].tensor)
        assert ContentKey.of(host[fqn]) != ContentKey.of(pristine.host_tensors()[fqn])
    assert _outputs_match(lowered, OTHER_VALUES)


def test_a_reused_so_whose_constants_do_not_read_back_is_compiled(
    cache: Cache, caplog: pytest.LogCaptureFixture
) -> None:
    """Were the recorded blob layout wrong (here two slots swapped), the container would hold other bytes
    than the program's: the entry is compiled instead, never kept."""
    manifest = json.loads((cache.entry / MANIFEST).read_text())
    offsets = manifest["blob_offsets"]
    offsets["w"], offsets["v"] = offsets["v"], offsets["w"]
    (cache.entry / MANIFEST).write_text(json.dumps(manifest))
    with caplog.at_level(logging.INFO, logger=aoti_cache.__name__):
        lowered = cache.lower(OTHER_VALUES)
    assert len(cache.compiles) == 1
    [message] = [r.getMessage() for r in caplog.records if r.name == aoti_cache.__name__]
    assert f"the .so of {cache.entry} does not fit (other bytes for ['v', 'w'])" in message, message
    assert _outputs_match(lowered, OTHER_VALUES)


def test_other_inlined_values_are_compiled(cache: Cache) -> None:
    cache.lower(OTHER_INLINED)
    assert len(cache.compiles) == 1


def test_a_relative_cache_folder_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor runs g++ in a folder of its own: a relative output path there names nothing."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(CACHE_ENV, "relative")
    assert aoti_cache.cache_dir() == tmp_path / "relative"


@dataclass
class Objects:
    root: Path
    """A cache holding the wrapper object compiled for SMALLEST, and nothing else."""
    commands: list[str]
    """Every compiler command inductor ran since."""


@pytest.fixture
def objects(pristine: CompiledMethod, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Objects:
    from torch._inductor import cpp_builder

    root = tmp_path / "cache"
    shutil.copytree(pristine.dir.parents[1] / OBJECTS, root / OBJECTS)
    monkeypatch.setenv(CACHE_ENV, str(root))
    commands: list[str] = []
    run = cpp_builder.run_compile_cmd

    def recording_run(cmd_line: str, cwd: str) -> None:
        commands.append(cmd_line)
        run(cmd_line, cwd)

    monkeypatch.setattr(cpp_builder, "run_compile_cmd", recording_run)
    return Objects(root, commands)


def test_a_wrapper_compiled_before_is_not_compiled_again(objects: Objects, tmp_path: Path) -> None:
    """OTHER_INLINED inlines other values into its kernels: inductor compiles it, the wrapper it generates is
    SMALLEST's, and its object comes from the cache."""
    lowered = AotiBackend().lower(OTHER_INLINED.export(), tmp_path)
    assert any(".kernel.cpp" in c for c in objects.commands), objects.commands
    assert not [c for c in objects.commands if ".wrapper.cpp" in c]
    assert _outputs_match(lowered, OTHER_INLINED)


def test_a_damaged_wrapper_object_is_compiled_again(
    objects: Objects, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    [stored] = (objects.root / OBJECTS).rglob("*.o")
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger=aoti_objects.__name__):
        lowered = AotiBackend().lower(OTHER_INLINED.export(), tmp_path)
    assert len([c for c in objects.commands if ".wrapper.cpp" in c]) == 1
    assert [r.getMessage() for r in caplog.records if r.name == aoti_objects.__name__] == [
        f"AOTI wrapper object {stored} does not match its digest; compiling it again"
    ]
    assert _outputs_match(lowered, OTHER_INLINED)
    assert stored.read_bytes() != bytes(data)  # replaced by the sound object
