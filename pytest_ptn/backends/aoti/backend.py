"""The ``aoti`` backends: every method compiled with AOTInductor as ExecuTorch does it, loaded into AOTI
containers that share constants across methods. CUDA when torch sees a GPU, else CPU.

Two sharing policies, one backend each:

- ``aoti``: the reference content-addressed SharingCache. Every constant of a container is bound
  user-managed (zero-copy) from host bytes: a hit allocates nothing, a miss one copy. The dense blob is never
  loaded, because ``update_constant_buffer_from_blob`` allocates a method's whole blob even when every
  constant then comes from the cache.
- ``aoti-upstream``: the ExecuTorch CUDA delegate (pytorch/executorch#21959, mirror main's dense-blob
  format): a cache keyed by original FQN, shared by every program loaded and never cleared; when a method
  has an uncached name its blob is loaded and cached names are compared on metadata only; when every name
  is cached nothing is compared at all.

State is never shared through a cache: the graph signatures say which buffers some method mutates, and one
tensor per such FQN per loaded program is bound user-managed into every container holding it, so writes are
seen by every method of that copy only (E3, E4). A method that only reads a small mutated buffer is compiled
with ``always_keep_tensor_constants``, else inductor would bake the buffer's initial value into its code.

Crashes: a container run before its constants are bound segfaults. A container becomes runnable only after
every constant is bound (``validate_full_updates``) or its blob loaded, and a cached tensor smaller than the
constant it would stand for is refused instead of bound, so no load can reach that crash.

Heavy imports happen inside methods: the plugin imports this module at start-up.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_ptn.backend import (
    Availability,
    Backend,
    Capability,
    Loaded,
    Lowered,
    MemoryReading,
    package_version,
)
from pytest_ptn.instruments.memory import MallocMemory, MemoryProbe, NvmlMemory

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from pytest_ptn.backends.aoti.cache import CompiledMethod, Runner
    from pytest_ptn.instruments.content import SharingCache


def _compiler() -> str | None:
    """The C++ compiler inductor invokes: $CXX, else its platform default (cpp_builder.get_cpp_compiler)."""
    return shutil.which(os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++"))


class AotiBackend(Backend):
    """AOTInductor per method, constants shared through the reference content-addressed cache."""

    name = "aoti"
    capabilities = frozenset({Capability.EXECUTE, Capability.STORAGE, Capability.STATE, Capability.MEMORY})

    def __init__(self) -> None:
        self._cache: SharingCache | None = None
        self._lock = threading.Lock()

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("torch") is None:
            return Availability(False, "missing torch")
        cxx = _compiler()
        if cxx is None:
            return Availability(False, "no C++ compiler ($CXX or g++): AOTInductor compiles every method")
        return Availability(True, versions={"torch": package_version("torch") or "?", "c++": cxx})

    def lower(self, programs: dict[str, ExportedProgram], workdir: Path) -> AotiLowered:
        import torch

        from pytest_ptn.backends.aoti.cache import EXECUTORCH_OPTIONS, TEST_OPTIONS, compile_method
        from pytest_ptn.programs.exported import functionalize, mutable_keys

        functional = functionalize(programs)
        mutable = mutable_keys(functional)
        _check_state(functional, mutable)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        compiled = {}
        for method, ep in functional.items():
            options = {**EXECUTORCH_OPTIONS, **TEST_OPTIONS, **_device_options(device)}
            if _reads_inlinable_state(ep, mutable):
                options["always_keep_tensor_constants"] = True
            compiled[method] = compile_method(ep, options, device, f"method {method!r}")
        return AotiLowered(workdir, compiled, frozenset(mutable), device)

    @property
    def cache(self) -> SharingCache:
        """One cache per backend instance, shared by every program it loads (so S4 means something)."""
        if self._cache is None:
            from pytest_ptn.instruments.content import SharingCache

            self._cache = SharingCache()
        return self._cache

    def load(self, lowered: Lowered) -> AotiLoaded:
        assert isinstance(lowered, AotiLowered)
        return ContentSharedLoaded(lowered, self._lock, self.cache)


class AotiUpstreamBackend(AotiBackend):
    """AOTInductor per method, constants shared the way the ExecuTorch CUDA delegate shares them."""

    name = "aoti-upstream"

    def __init__(self) -> None:
        super().__init__()
        self._by_name = FqnCache()

    def load(self, lowered: Lowered) -> AotiLoaded:
        assert isinstance(lowered, AotiLowered)
        return UpstreamLoaded(lowered, self._lock, self._by_name)


class AotiLowered(Lowered):
    """Compiled methods (entries of the on-disk cache) and the keys some method mutates."""

    def __init__(self, path: Path, methods: dict[str, CompiledMethod], mutable: frozenset[str], device: str):
        self.path = path
        self.methods = methods
        self.mutable = mutable
        self.device = device


class AotiLoaded(Loaded):
    """One loaded copy: a container per loaded method, its own state tensors, a ledger of constant memory."""

    def __init__(self, lowered: AotiLowered, lock: threading.Lock):
        self._lowered = lowered
        self._lock = lock
        self._device = lowered.device
        self._runners: dict[str, Runner] = {}
        self._state = self._initial_state()
        self._allocated = 0
        self._probe: MemoryProbe = _gpu_memory() if self._device == "cuda" else MallocMemory()

    def _initial_state(self) -> dict[str, torch.Tensor]:
        """One private tensor per mutated FQN, from the first container holding it (initial bytes agree)."""
        state: dict[str, torch.Tensor] = {}
        for compiled in self._lowered.methods.values():
            missing = [fqn for fqn in compiled.constants if fqn in self._lowered.mutable and fqn not in state]
            if missing:
                host = compiled.host_tensors()
                state.update({fqn: host[fqn].to(self._device, copy=True) for fqn in missing})
        return state

    def _compiled(self, method: str) -> CompiledMethod:
        if method not in self._lowered.methods:
            raise KeyError(f"no method {method!r} (has {sorted(self._lowered.methods)})")
        return self._lowered.methods[method]

    def load_method(self, method: str) -> None:
        from pytest_ptn.backends.aoti.cache import runner

        compiled = self._compiled(method)
        with self._lock:
            if method in self._runners:
                return
            container = runner(compiled.so, self._device)
            self._probe.around(lambda: self._bind(compiled, container))
            self._runners[method] = container

    def _bind(self, compiled: CompiledMethod, container: Runner) -> None:
        """Give ``container`` every constant: from the cache, its own blob, or this copy's state."""
        raise NotImplementedError

    def _state_pairs(self, compiled: CompiledMethod) -> dict[str, torch.Tensor]:
        return {c.name: self._state[fqn] for fqn, c in compiled.constants.items() if fqn in self._state}

    def run(self, method: str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        import torch

        self.load_method(method)
        args = [t.to(self._device) for t in inputs]
        with torch.no_grad():
            outs = self._runners[method].run(args)
        for given, arg in zip(inputs, args, strict=True):
            if arg is not given:  # a device copy: write input mutations back as eager does
                given.copy_(arg)
        return [o.cpu() for o in outs]

    def storage(self, method: str, key: str) -> int:
        """data_ptr of the constant the container uses for ``key``. A constant with no allocation (inlined
        into the code, or never read) is identified by its content (negative, so never a real address)."""
        self.load_method(method)
        compiled = self._compiled(method)
        if key in compiled.absent:
            return -1 - int(compiled.absent[key][:15], 16)
        if key not in compiled.keys:
            raise KeyError(f"method {method!r} has no constant {key!r}")
        return self._runners[method].extract_constants_map(False)[compiled.keys[key]].data_ptr()

    def state(self) -> dict[str, torch.Tensor]:
        return {fqn: t.cpu() for fqn, t in self._state.items()}

    def _allocate(self, nbytes: int) -> None:
        """Count constant memory this copy's loading made AOTI or the cache allocate (nothing is freed)."""
        self._allocated += nbytes

    def constant_memory(self) -> MemoryReading:
        """The ledger of constant allocations, raised to the measured growth when that exceeds the ledger
        by more than the instrument's resolution (an allocation the ledger does not know of)."""
        measured, resolution = self._probe.peak, self._probe.resolution
        counted = (
            measured if measured is not None and measured > self._allocated + resolution else self._allocated
        )
        return MemoryReading(
            counted,
            f"ledger {self._allocated} B (AOTI blob allocations + cache copies); {self._probe.name} grew "
            f"{measured} B while loading (counted instead when above the ledger by > {resolution} B)"
            + (f"; {self._probe.alongside}" if self._probe.alongside else ""),
        )


class ContentSharedLoaded(AotiLoaded):
    """The reference policy: shared by content, keyed by the digests the compile cache recorded (S1-S6)."""

    def __init__(self, lowered: AotiLowered, lock: threading.Lock, cache: SharingCache):
        super().__init__(lowered, lock)
        self._cache = cache

    def _bind(self, compiled: CompiledMethod, container: Runner) -> None:
        host = compiled.host_tensors()
        pairs = self._state_pairs(compiled)
        for fqn, c in compiled.constants.items():
            if fqn not in self._state:  # keyed by the digest the cache entry recorded for these very bytes
                pairs[c.name] = self._cache.share(host[fqn], self._materialize, c.content_key())
        if pairs:
            container.update_constant_buffer(pairs, False, True, True)

    def _materialize(self, host: torch.Tensor) -> torch.Tensor:
        self._allocate(host.nbytes)
        return host.to(self._device, copy=True)


class FqnCache:
    """Upstream's shared_constant_tensors_: the first tensor loaded under each original FQN, from any
    program, never cleared. One per backend instance, which the plugin makes once per run: process-wide in
    effect, while a fresh instance (as the S6 test makes) starts empty."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.containers: list[Runner] = []
        """Containers whose blobs back cached tensors: never freed, as upstream never deletes containers."""


class UpstreamLoaded(AotiLoaded):
    """The CUDA delegate's load_constants_with_cache, on AOTI containers."""

    def __init__(self, lowered: AotiLowered, lock: threading.Lock, by_name: FqnCache):
        super().__init__(lowered, lock)
        self._by_name = by_name

    def _bind(self, compiled: CompiledMethod, container: Runner) -> None:
        cache = self._by_name.tensors
        immutable = {fqn: c for fqn, c in compiled.constants.items() if fqn not in self._state}
        pairs = self._state_pairs(compiled)
        if any(fqn not in cache for fqn in immutable):
            container.update_constant_buffer_from_blob(str(compiled.blob))
            self._allocate(compiled.blob_bytes)
            self._by_name.containers.append(container)
            own = container.extract_constants_map(False)
            for fqn, c in immutable.items():
                cached = cache.setdefault(fqn, own[fqn])
                if cached is not own[fqn] and _same_metadata(cached, own[fqn]):
                    pairs[c.name] = cached
            full = False
        else:  # every name cached: shared on the name alone
            for fqn, c in immutable.items():
                cached = cache[fqn]
                if cached.nbytes < c.nbytes:
                    raise RuntimeError(
                        f"aoti-upstream: cached {fqn!r} has {cached.nbytes} B, the container's constant "
                        f"{c.nbytes} B: the delegate would read out of bounds"
                    )
                pairs[c.name] = cached
            full = True
        if pairs:
            container.update_constant_buffer(pairs, False, full, True)


def _same_metadata(a: torch.Tensor, b: torch.Tensor) -> bool:
    """check_cached_constant_match: dtype, sizes, strides, device; never the bytes."""
    return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and a.device == b.device


def _check_state(programs: dict[str, ExportedProgram], mutable: set[str]) -> None:
    """One tensor backs a mutated FQN in every method, so the methods must agree on its initial value."""
    from pytest_ptn.instruments.content import ContentKey
    from pytest_ptn.programs.exported import constants_of
    from pytest_ptn.reference.planner import StateConflictError

    first: dict[str, tuple[str, ContentKey]] = {}
    for method, ep in programs.items():
        for key, use in constants_of(ep).items():
            if key not in mutable:
                continue
            content = ContentKey.of(use.tensor)
            other, seen = first.setdefault(key, (method, content))
            if seen != content:
                raise StateConflictError(
                    f"mutable key {key!r} differs between methods {other!r} and {method!r}: one tensor backs "
                    "it in every method of a loaded program",
                    (other, method),
                    (key,),
                )


def _reads_inlinable_state(ep: ExportedProgram, mutable: set[str]) -> bool:
    """Whether ``ep`` reads, without writing it, a mutated buffer small enough for inductor to inline."""
    from pytest_ptn.backends.aoti.cache import inlinable
    from pytest_ptn.programs.exported import constants_of, read_keys

    written = set(ep.graph_signature.buffers_to_mutate.values())
    constants = constants_of(ep)
    return any(
        key in mutable and key not in written and inlinable(constants[key].tensor) for key in read_keys(ep)
    )


# CUDA only (not exercised on CPU machines; run by conformance/gpu/nightly.sh).


def _device_options(device: str) -> dict[str, object]:
    """Kernels embedded in the .so, as ExecuTorch's CudaBackend does, so a container needs no cubin folder."""
    return {"aot_inductor.embed_kernel_binary": True} if device == "cuda" else {}


def _gpu_memory() -> NvmlMemory:
    return NvmlMemory(resolution=CACHING_ALLOCATOR_SEGMENT)


CACHING_ALLOCATOR_SEGMENT = 20 << 20
"""The resolution on CUDA: cache copies come from torch's caching allocator, which reserves in segments."""
