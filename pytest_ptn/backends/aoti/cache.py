"""AOTInductor compiles of single methods, cached on disk by content so a rerun does not recompile.

A method compiles the way ExecuTorch's AotiBackend does it (``aot_compile`` on ``ep.module()``, weights out
of the .so in a dense binary blob). The key hashes everything that decides the output: the code of every
graph, the placeholders' metadata, the graph signature, every constant's metadata and bytes, the torch
version, the options and the device. An entry holds the wrapper .so, AOTI's dense blob (what the upstream
CUDA delegate loads), the same constants again one by one in ``weights.bin`` (what a loader binds constant by
constant, as executorch 1.5.1's per-FQN weights do) and a manifest that ties the exported program's constant
keys to the container's and records the sha256 of every constant's bytes in ``weights.bin``. Entries are
written into a temporary folder and renamed into place, so concurrent workers never see half an entry, and
are never written again: the digests stay those of the bytes next to them, so a loader keys its sharing
cache with them instead of hashing every weight again on every load (S2, S3).

A cache outlives the processes that write it (killed compiles, partly restored CI caches, full disks), so
entries are synced to disk before they are published and checked against their manifest (sizes, and the
.so's digest) before every use: a damaged entry costs one recompile and a logged warning, never a failed
lowering or a process killed by a truncated .so. Whoever next compiles removes the folders of compiles
whose process died.

Most compiles of a run differ from an earlier one only in constant values (the scenarios collide on purpose:
same names, same graphs, other bytes), and with weights out of the .so those values never reach the code,
except where inductor inlines a small constant. So a compile is also recorded under a structure key (the
content key without the bytes of the constants inductor keeps as constants), and a method whose structure
was compiled before reuses that .so: its entry is the .so plus a blob holding its own bytes at the compiled
blob's offsets, read back the way a compile's is and kept only when every constant the container holds is
the program's own; anything else compiles.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.utils import _pytree as pytree

from pytest_ptn.backends.aoti.objects import wrapper_objects
from pytest_ptn.instruments.content import ContentKey, digest, host_memory, tensor_bytes
from pytest_ptn.programs.exported import constants_of, read_keys

CACHE_ENV = "PTN_AOTI_CACHE"
FORMAT = "pytest-ptn aoti cache 5"
"""Bumped whenever the layout of an entry changes, so old entries are never misread."""
ALIGNMENT = 64
"""AOTI_CONST_ALIGNMENT (aoti_runtime/model_base.h): each constant's slot in the blob AOTI allocates."""
EXECUTORCH_OPTIONS: dict[str, Any] = {
    "aot_inductor.package": True,
    "aot_inductor.package_constants_in_so": False,
    "aot_inductor.package_constants_on_disk_format": "binary_blob",
}
"""What ExecuTorch's AOTI backends set to keep weights out of the .so (mirror main's dense-blob format)."""
TEST_OPTIONS: dict[str, Any] = {"aot_inductor.compile_wrapper_opt_level": "O0"}
"""What a test build changes: the wrapper (the runtime's bookkeeping and the calls into the kernels and
libtorch, no arithmetic of its own) unoptimized, a fifth less g++ time per compile; the kernels keep -O3."""
MANIFEST = "manifest.json"
STRUCTURES = "by-structure"
"""Under the cache root: a link per structure key to the entry whose .so compiles it."""
SO = "model.wrapper.so"
BLOB = "weights.blob"
WEIGHTS = "weights.bin"
FILES = (SO, BLOB, WEIGHTS)
"""The files of an entry besides its manifest, which records each one's size."""
HASHED = frozenset({SO})
"""Files whose sha256 the manifest records and every use checks: a damaged .so kills the process that loads
it (SIGBUS, SIGSEGV), and hashing its few MB costs milliseconds. Weights are checked by size only: GBs for
a real model, and damaged bytes there give wrong outputs, not a crash."""
TEMPORARY_PREFIX = ".tmp-"
LOCK = ".lock"
"""In a compile's temporary folder, locked (flock) by the compiling process until it is done: the kernel
releases the lock when that process dies, so an unlocked folder is abandoned, whatever its age."""
ABANDONED_AFTER_S = 3600
"""Age after which a temporary folder without a lock file is abandoned: one being created this instant
has none yet, nor does a discarded entry being removed or a folder left by an older pytest-ptn."""

log = logging.getLogger(__name__)
"""Damaged entries are logged, not warned: under ``filterwarnings = error`` a warning would turn the
recompile that repairs the entry into the failure it avoids, and the suite reports warnings raised during
a backend's calls as the backend's own."""


class BrokenEntryError(ValueError):
    """A cache entry that does not match its manifest, or whose manifest is unreadable."""


class Runner(Protocol):
    """The part of ``torch._C._aoti.AOTIModelContainerRunner{Cpu,Cuda}`` the loaders use (the stubs lack
    ``update_constant_buffer_from_blob``)."""

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]: ...
    def get_constant_names_to_original_fqns(self) -> dict[str, str]: ...
    def extract_constants_map(self, use_inactive: bool) -> dict[str, torch.Tensor]: ...
    def update_constant_buffer_from_blob(self, path: str) -> None: ...
    def update_constant_buffer(
        self,
        tensors: dict[str, torch.Tensor],
        use_inactive: bool,
        validate_full_updates: bool,
        user_managed: bool,
    ) -> None: ...


def cache_dir() -> Path:
    """Absolute: inductor runs the compiler in a folder of its own, where a relative path names nothing."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "pytest-ptn" / "aoti").absolute()


def runner(so: Path, device: str) -> Runner:
    """A container for ``so`` with no constants yet: running it before they are bound would segfault."""
    aoti: Any = torch._C._aoti
    if device == "cuda":
        return aoti.AOTIModelContainerRunnerCuda(str(so), 1, "cuda")
    return aoti.AOTIModelContainerRunnerCpu(str(so), 1)


def align(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


@dataclass(frozen=True)
class ConstantInfo:
    """One constant of a container, by its original FQN."""

    name: str
    """AOTI's internal name: what ``update_constant_buffer`` takes."""
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    """Where its bytes start in ``weights.bin``."""
    nbytes: int
    sha256: str
    """Digest of its ``nbytes`` bytes in ``weights.bin``, taken when they were written."""

    def content_key(self) -> ContentKey:
        """``ContentKey.of`` the constant's host tensor, from the manifest: no pass over its bytes."""
        return ContentKey(_dtype(self.dtype), self.shape, self.stride, self.sha256)


@dataclass(frozen=True)
class FileRecord:
    """What the manifest records of one file of an entry, to tell a damaged file before it is used."""

    size: int
    sha256: str | None = None
    """Only for the files in ``HASHED``."""

    @classmethod
    def of(cls, path: Path) -> FileRecord:
        return cls(path.stat().st_size, _file_sha256(path) if path.name in HASHED else None)

    def problem(self, path: Path) -> str | None:
        """What is wrong with ``path``, or None. The size is checked before the digest: a truncated .so is
        refused before anything maps it."""
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return f"{path.name} is missing"
        if size != self.size:
            return f"{path.name} has {size} B, the manifest records {self.size} B"
        if self.sha256 is not None and _file_sha256(path) != self.sha256:
            return f"{path.name} does not have the sha256 the manifest records"
        return None


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class CompiledMethod:
    """A cache entry: one compiled method, what its container holds, how the program's keys map to it."""

    dir: Path
    constants: dict[str, ConstantInfo]
    """original FQN -> constant, for every constant of the container."""
    keys: dict[str, str]
    """exported program's constant key -> original FQN of the container constant holding it."""
    absent: dict[str, str]
    """exported program's constant key -> content id, for constants with no allocation behind them: AOTI
    baked them into the code (0-dim tensors, 1-D tensors of at most 8 elements) or the graph never reads
    them (export keeps every parameter and buffer of the module)."""
    blob_offsets: dict[str, int] | None = None
    """original FQN -> where the constant's bytes start in the blob; None when the layout did not check out
    (the entry is then never reused for another program's values)."""

    @property
    def so(self) -> Path:
        return self.dir / SO

    @property
    def blob(self) -> Path:
        return self.dir / BLOB

    @property
    def blob_bytes(self) -> int:
        """What ``update_constant_buffer_from_blob`` allocates: every constant in a 64-byte slot."""
        return sum(align(c.nbytes) for c in self.constants.values())

    def host_tensors(self) -> dict[str, torch.Tensor]:
        """Every constant as a copy-on-write view of ``weights.bin``: reading it costs no anonymous memory."""
        size = os.path.getsize(self.dir / WEIGHTS)
        if not size:
            return {}
        data = torch.from_file(str(self.dir / WEIGHTS), shared=False, size=size, dtype=torch.uint8)
        return {
            fqn: data[c.offset : c.offset + c.nbytes].view(_dtype(c.dtype)).as_strided(c.shape, c.stride)
            for fqn, c in self.constants.items()
        }

    @classmethod
    def read(cls, entry: Path) -> CompiledMethod:
        """The entry in ``entry``, once its manifest parses and every file matches it, else
        ``BrokenEntryError`` saying what is wrong."""
        where = f"AOTI cache entry {entry}"
        try:
            m = json.loads((entry / MANIFEST).read_text())
        except (OSError, ValueError) as e:
            raise BrokenEntryError(f"{where}: {MANIFEST} is unreadable ({type(e).__name__}: {e})") from e
        if not isinstance(m, dict):
            raise BrokenEntryError(f"{where}: {MANIFEST} holds a {type(m).__name__}, not an object")
        if m.get("format") != FORMAT:  # cache keys include FORMAT, so only a path given by hand gets here
            raise BrokenEntryError(f"{where}: a cache entry of format {m.get('format')!r}, not {FORMAT!r}")
        try:
            files = {name: FileRecord(**m["files"][name]) for name in FILES}
            constants = {
                fqn: ConstantInfo(
                    c["name"],
                    c["dtype"],
                    tuple(c["shape"]),
                    tuple(c["stride"]),
                    c["offset"],
                    c["nbytes"],
                    c["sha256"],
                )
                for fqn, c in m["constants"].items()
            }
            keys, absent = dict(m["keys"]), dict(m["absent"])
            offsets = None if m["blob_offsets"] is None else dict(m["blob_offsets"])
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise BrokenEntryError(f"{where}: {MANIFEST} is malformed ({type(e).__name__}: {e})") from e
        for name, record in files.items():
            problem = record.problem(entry / name)
            if problem is not None:
                raise BrokenEntryError(f"{where}: {problem}")
        return cls(entry, constants, keys, absent, offsets)


def compile_method(ep: ExportedProgram, options: dict[str, Any], device: str, label: str) -> CompiledMethod:
    """``ep`` compiled for ``device``, from the cache when it holds a sound entry with its key; a damaged
    one is discarded and compiled again."""
    root = cache_dir()
    key = cache_key(ep, options, device)
    entry = root / key[:2] / key
    if entry.exists():
        try:
            return CompiledMethod.read(entry)
        except BrokenEntryError as e:
            log.warning("%s; discarded, compiling it again", e)
            _discard(entry)
    entry.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_temporaries(root)
    structure = root / STRUCTURES / structure_key(ep, options, device)
    with compile_folder(entry.parent) as tmp:
        reused = _reuse_into(tmp, structure, ep, device, label)
        if not reused:
            with wrapper_objects(root):
                _compile_into(tmp, ep, options, device, label)
        _publish(tmp, entry)
    method = CompiledMethod.read(entry)
    if not reused and method.blob_offsets is not None:
        _link(structure, entry)
    return method


@contextmanager
def compile_folder(parent: Path) -> Iterator[Path]:
    """A private temporary folder in ``parent``, holding ``LOCK`` locked while it is in use. The lock is
    taken on a file of another name and renamed to ``LOCK``, so no cleaner ever finds it unlocked."""
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=TEMPORARY_PREFIX))
    try:
        with open(tmp / f"{LOCK}.new", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            os.rename(tmp / f"{LOCK}.new", tmp / LOCK)
            yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, entry: Path) -> None:
    """Rename the finished ``tmp`` to ``entry`` once its bytes are on disk: a rename can reach the disk
    before the data it names, and a crash then leaves an entry whose files are empty or short."""
    for name in (*FILES, MANIFEST):
        _fsync(tmp / name)
    (tmp / LOCK).unlink()
    _fsync(tmp)
    try:
        tmp.rename(entry)
    except OSError:
        if not (entry / MANIFEST).exists():  # not a concurrent writer's finished entry
            raise
    _fsync(entry.parent)


def _link(structure: Path, entry: Path) -> None:
    """Point ``structure`` at ``entry`` (replacing a link to an entry since discarded), in one rename."""
    structure.parent.mkdir(parents=True, exist_ok=True)
    new = structure.with_name(f"{TEMPORARY_PREFIX}{uuid.uuid4().hex}")
    os.symlink(os.path.relpath(entry, structure.parent), new)
    os.replace(new, structure)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _discard(entry: Path) -> None:
    """Move ``entry`` aside in one rename, so no reader finds it half removed, then remove it."""
    aside = entry.with_name(f"{TEMPORARY_PREFIX}{uuid.uuid4().hex}")
    try:
        entry.rename(aside)
    except FileNotFoundError:  # another worker discarded it first
        return
    shutil.rmtree(aside, ignore_errors=True)


def _remove_abandoned_temporaries(root: Path) -> None:
    """Remove the temporary folders of compiles whose process died (killed, out of memory), never one a
    live compile holds, in this process or any other sharing the cache (xdist workers)."""
    for tmp in root.glob(f"*/{TEMPORARY_PREFIX}*"):
        if _abandoned(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def _abandoned(tmp: Path) -> bool:
    try:
        with open(tmp / LOCK) as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True
    except OSError:  # no lock file (or not a folder): judged by age
        pass
    try:
        return time.time() - tmp.stat().st_mtime > ABANDONED_AFTER_S
    except FileNotFoundError:  # its compile finished or its remover got there first
        return False


def cache_key(ep: ExportedProgram, options: dict[str, Any], device: str) -> str:
    """What decides an entry: the program, every constant's bytes included."""
    return _key("content", ep, options, device, lambda t: (digest(t),))


def structure_key(ep: ExportedProgram, options: dict[str, Any], device: str) -> str:
    """What decides a compiled .so with weights out of it: the program and every constant's layout (the .so
    records each constant's storage size and offset); the bytes only of constants inductor may inline, and
    which constants share a storage (inductor stores those once) or hold equal bytes (the keys matched to
    the container by content are then ambiguous only where swapping them changes nothing)."""
    storages: dict[tuple[object, ...], int] = {}
    contents: dict[str, int] = {}

    def layout(t: torch.Tensor) -> tuple[object, ...]:
        storage = t.untyped_storage()
        alias = storages.setdefault((storage.data_ptr(), t.storage_offset(), *_meta(t)), len(storages))
        equal = contents.setdefault(content_id(t), len(contents))
        return t.storage_offset(), storage.nbytes(), alias, equal, digest(t) if inlinable(t) else None

    return _key("structure", ep, options, device, layout)


def _key(
    kind: str,
    ep: ExportedProgram,
    options: dict[str, Any],
    device: str,
    constant: Callable[[torch.Tensor], tuple[object, ...]],
) -> str:
    h = hashlib.sha256()

    def feed(*parts: object) -> None:
        for p in parts:
            h.update(str(p).encode())
            h.update(b"\0")

    feed(FORMAT, kind, torch.__version__, device, json.dumps(options, sort_keys=True))
    for name, module in ep.graph_module.named_modules():
        if isinstance(module, torch.fx.GraphModule):
            feed(name, module.code)
    for node in ep.graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        feed(node.name, *(_meta(val) if isinstance(val, torch.Tensor) else (val,)))
    feed(ep.graph_signature)
    for key, use in sorted(constants_of(ep).items()):
        feed(key, *_meta(use.tensor), *constant(use.tensor))
    return h.hexdigest()


def _meta(t: torch.Tensor) -> tuple[object, ...]:
    return t.dtype, tuple(t.shape), tuple(t.stride())


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."))
    assert isinstance(dtype, torch.dtype)
    return dtype


def inlinable(t: torch.Tensor) -> bool:
    """Whether inductor bakes ``t`` into the code instead of keeping a constant (GraphLowering.get_attr)."""
    return t.dim() == 0 or (t.dim() == 1 and t.shape[0] <= 8)


def content_id(t: torch.Tensor) -> str:
    return hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|{digest(t)}".encode()).hexdigest()


def _compile_into(out: Path, ep: ExportedProgram, options: dict[str, Any], device: str, label: str) -> None:
    """Compile into a private folder (AOTI names its files by a hash of the code, equal for methods that
    differ only in constant values, so a shared folder lets one compile overwrite another's blob), keep the
    .so and the blob, and read the constants back."""
    compiled = ep
    if device != "cpu":
        from torch.export.passes import move_to_device_pass

        compiled = move_to_device_pass(ep, device)
    users = set(compiled.graph_signature.user_inputs)
    examples = [n.meta["val"] for n in compiled.graph.find_nodes(op="placeholder") if n.name in users]
    # ep.module() takes its inputs as the program declares them (keywords: optimum-executorch's methods);
    # the compiled runner takes them flat, in that order.
    args, kwargs = pytree.tree_unflatten(examples, compiled.call_spec.in_spec)
    scratch = out / "aoti"
    try:
        with torch.no_grad():
            paths = torch._inductor.aot_compile(
                compiled.module(),
                tuple(args),
                kwargs=kwargs,
                options={**options, "aot_inductor.output_path": str(scratch)},
            )
    except Exception as e:  # inductor's own errors name no method
        raise RuntimeError(f"{label}: AOTInductor failed: {type(e).__name__}: {e}") from e
    assert isinstance(paths, list), f"aot_compile with package=True gave {paths!r}"
    files = [p for p in paths if isinstance(p, str)]
    os.replace(next(p for p in files if p.endswith(".wrapper.so")), out / SO)
    os.replace(next(p for p in files if p.endswith("_weights.blob")), out / BLOB)
    shutil.rmtree(scratch)
    _read_back(out, ep, device, label)


def _reuse_into(out: Path, structure: Path, ep: ExportedProgram, device: str, label: str) -> bool:
    """Whether ``out`` now holds ``ep``'s entry made from the .so that ``structure`` links to: a blob with
    ``ep``'s bytes at the compiled blob's offsets, read back, and kept only when every key maps to the
    container constant the compiled entry maps it to, holding exactly ``ep``'s bytes for that key."""
    if not structure.exists():
        return False
    try:
        source = CompiledMethod.read(structure.resolve())
    except BrokenEntryError as e:  # its entry is recompiled when its own content is asked for
        log.info("%s; not reused", e)
        return False
    constants = constants_of(ep)
    values: dict[str, torch.Tensor] = {}
    for key, fqn in source.keys.items():
        values.setdefault(fqn, constants[key].tensor)
    offsets = source.blob_offsets
    if offsets is None or values.keys() != source.constants.keys():
        return False
    blob = bytearray(source.blob.stat().st_size)
    for fqn, t in values.items():
        data = tensor_bytes(t)
        if len(data) != source.constants[fqn].nbytes:
            return False
        blob[offsets[fqn] : offsets[fqn] + len(data)] = data
    shutil.copyfile(source.so, out / SO)
    (out / BLOB).write_bytes(blob)
    try:
        infos, keys, absent = _read_back(out, ep, device, label)
    except RuntimeError as e:  # a key read yet held by no constant of the container
        problem: str | None = str(e)
    else:
        wrong = [
            k for k, fqn in keys.items() if infos[fqn].content_key() != ContentKey.of(constants[k].tensor)
        ]
        if keys != source.keys or absent.keys() != source.absent.keys():
            problem = (
                f"keys {keys}, absent {sorted(absent)}: the compiled {source.keys}, {sorted(source.absent)}"
            )
        else:
            problem = f"other bytes for {wrong}" if wrong else None
    if problem is None:
        return True
    log.info("%s: the .so of %s does not fit (%s); compiling", label, source.dir, problem)
    for name in (*FILES, MANIFEST):
        (out / name).unlink(missing_ok=True)
    return False


def _read_back(
    out: Path, ep: ExportedProgram, device: str, label: str
) -> tuple[dict[str, ConstantInfo], dict[str, str], dict[str, str]]:
    """Load the .so and blob in ``out`` into a container and write ``weights.bin`` and, last, the manifest
    from what it holds; returns the container's constants (as written: the container's own memory goes with
    it), and ``ep``'s keys mapped to them or absent."""
    container = runner(out / SO, device)
    # An empty blob cannot be mapped, and a container without constants needs none.
    if os.path.getsize(out / BLOB):
        container.update_constant_buffer_from_blob(str(out / BLOB))
    held = container.extract_constants_map(False)
    infos: dict[str, ConstantInfo] = {}
    offset = 0
    with open(out / WEIGHTS, "wb") as f:
        for name, fqn in sorted(container.get_constant_names_to_original_fqns().items()):
            t = held[fqn].detach().cpu()
            if not t.is_contiguous():
                raise NotImplementedError(f"{label}: AOTI holds {fqn!r} with strides {t.stride()}")
            data = bytes(host_memory(t))
            f.write(data + bytes(align(len(data)) - len(data)))
            infos[fqn] = ConstantInfo(
                name,
                str(t.dtype),
                tuple(t.shape),
                tuple(t.stride()),
                offset,
                len(data),
                hashlib.sha256(data).hexdigest(),  # = digest(t): t is contiguous
            )
            offset += align(len(data))
    keys, absent = _map_keys(ep, held, label)
    manifest = {
        "format": FORMAT,
        "files": {name: asdict(FileRecord.of(out / name)) for name in FILES},
        "constants": {k: asdict(v) for k, v in infos.items()},
        "keys": keys,
        "absent": absent,
        "blob_offsets": _blob_offsets(out / BLOB, held),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return infos, keys, absent


def _blob_offsets(blob: Path, held: dict[str, torch.Tensor]) -> dict[str, int] | None:
    """Where each constant's bytes start in ``blob``, or None unless that layout reproduces the blob.

    AOTI's blob is every constant's storage in the order of the .so's constant table, each in a 64-byte slot
    when any constant is on the CPU, packed otherwise (cpp_wrapper_cpu's data_size), and the container
    copies it into one allocation in that order: the addresses give the order, the sizes the offsets."""
    data = blob.read_bytes()
    tensors = sorted(held.items(), key=lambda item: item[1].data_ptr())
    if any(t.storage_offset() or t.untyped_storage().nbytes() != t.nbytes for _, t in tensors):
        return None  # a view of a larger storage: the blob holds the whole storage
    for slot in (align, int):
        offsets: dict[str, int] = {}
        end = 0
        for fqn, t in tensors:
            offsets[fqn] = end
            end += slot(t.nbytes)
        if end == len(data) and all(
            data[offsets[fqn] : offsets[fqn] + t.nbytes] == tensor_bytes(t.cpu()) for fqn, t in tensors
        ):
            return offsets
    return None


def _map_keys(
    ep: ExportedProgram, held: dict[str, torch.Tensor], label: str
) -> tuple[dict[str, str], dict[str, str]]:
    """Tie every constant key of ``ep`` to the container constant holding it. Parameters and buffers keep
    their FQN; CONSTANT_TENSOR entries become ``_tensor_constant<i>`` by position in AOTI's re-trace, so they
    are matched by content (equal content in one method may share a match: either holds the same bytes)."""
    kinds = {s.target: s.kind for s in ep.graph_signature.input_specs}
    named = (InputKind.PARAMETER, InputKind.BUFFER)
    by_content: dict[str, list[str]] = {}
    for fqn, t in held.items():
        if kinds.get(fqn) not in named:
            by_content.setdefault(content_id(t.cpu()), []).append(fqn)
    read = read_keys(ep)
    keys: dict[str, str] = {}
    absent: dict[str, str] = {}
    used: set[str] = set()
    for key, use in sorted(constants_of(ep).items()):
        t = use.tensor
        cid = content_id(t)
        candidates = [key] if kinds[key] in named and key in held else by_content.get(cid, [])
        if candidates:
            keys[key] = next((c for c in candidates if c not in used), candidates[0])
            used.add(keys[key])
        elif inlinable(t) or key not in read:
            absent[key] = cid
        else:
            raise RuntimeError(
                f"{label}: constant {key!r} is read and too large to inline, yet not in the container"
            )
    return keys, absent
