"""Memory growth while something loads: one probe protocol, measured by NVML on a GPU, by malloc on the host.

NVML (nvidia-ml-py): torch's own counters see only its caching allocator: not AOTI's constant blobs (raw
``cudaMalloc``), nor anything the ExecuTorch CUDA delegate allocates. NVML sees the whole process, where the
driver shows it (``nvmlDeviceGetComputeRunningProcesses``): inside a container without the host PID namespace
no PID matches, and the device's used memory is taken instead, over a baseline read after torch's cache was
emptied (run on an otherwise idle GPU). The probe's name says which of the two produced the number, and the
caching allocator's counters (``torch.cuda.memory_stats``) are reported beside it. NVML keeps no peak, so a
thread samples it every millisecond while loading, which can miss a shorter spike.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

DRIVER_PAGE = 2 << 20
"""The granularity NVML's numbers move in: the driver maps device memory in 2 MiB pages."""


class MemoryProbe(Protocol):
    """Peak growth, over the baseline of the first ``around`` call, while the loads it wrapped ran."""

    name: str
    """Which instrument produced ``peak``, for the report."""
    resolution: int
    """The smallest growth the probe can see."""
    peak: int | None
    """None until a load was measured (or where the probe cannot measure)."""

    @property
    def alongside(self) -> str:
        """Other counters read over the same loads, for the report ("" when there are none)."""
        ...

    def around(self, load: Callable[[], object]) -> None: ...


class NvmlCounter:
    """NVML's used memory of this process where the driver lists it with a number, else of the device."""

    def __init__(self, uuid: str, pid: int | None = None) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml: ModuleType = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        self._pid = os.getpid() if pid is None else pid
        hidden = self._why_hidden()
        self.per_process = hidden is None
        self.name = (
            "NVML usedGpuMemory of this process (nvmlDeviceGetComputeRunningProcesses)"
            if hidden is None
            else f"NVML used memory of the whole device over a baseline read after torch.cuda.empty_cache() "
            f"(nvmlDeviceGetMemoryInfo; {hidden})"
        )

    def _processes(self) -> list[Any]:
        return list(self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle))

    def _why_hidden(self) -> str | None:
        """Why NVML gives no per-process number for this process, or None when it does."""
        try:
            mine = [p for p in self._processes() if p.pid == self._pid]
        except self._nvml.NVMLError as e:
            return f"the driver lists no processes: {e}"
        if not mine:
            return (
                f"the driver does not list pid {self._pid}, as in a container without the host PID namespace"
            )
        if mine[0].usedGpuMemory is None:
            return f"the driver lists pid {self._pid} without its usedGpuMemory"
        return None

    def used(self) -> int:
        if self.per_process:
            return sum(p.usedGpuMemory or 0 for p in self._processes() if p.pid == self._pid)
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)


class AllocatorCounters:
    """torch's caching allocator over the same loads: the peaks of allocated and reserved bytes over the
    first baseline. What torch itself allocated, beside what NVML saw of the whole process."""

    def __init__(self) -> None:
        self._base: tuple[int, int] | None = None
        self.allocated: int | None = None
        self.reserved: int | None = None

    def start(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats()
        if self._base is None:
            stats = torch.cuda.memory_stats()
            self._base = (
                stats.get("allocated_bytes.all.current", 0),
                stats.get("reserved_bytes.all.current", 0),
            )

    def stop(self) -> None:
        import torch

        assert self._base is not None, "stop() before start()"
        stats = torch.cuda.memory_stats()
        allocated = stats.get("allocated_bytes.all.peak", 0) - self._base[0]
        reserved = stats.get("reserved_bytes.all.peak", 0) - self._base[1]
        self.allocated = max(self.allocated or 0, allocated)
        self.reserved = max(self.reserved or 0, reserved)

    def __str__(self) -> str:
        return (
            f"torch caching allocator (memory_stats): allocated peak grew {self.allocated} B, reserved peak "
            f"grew {self.reserved} B"
        )


class NvmlMemory:
    """Peak growth over the first ``around`` call's baseline, on the GPU torch uses."""

    def __init__(self, resolution: int = DRIVER_PAGE) -> None:
        import torch

        torch.empty(1, device="cuda")  # the CUDA context exists before the baseline and before NVML looks
        uuid = torch.cuda.get_device_properties(torch.cuda.current_device()).uuid
        self._counter = NvmlCounter(f"GPU-{uuid}")
        self._allocator = AllocatorCounters()
        self.name = self._counter.name
        self.resolution = resolution
        self._base: int | None = None
        self.peak: int | None = None

    @property
    def alongside(self) -> str:
        return str(self._allocator)

    def around(self, load: Callable[[], object]) -> None:
        import torch

        if self._base is None:  # a clean baseline: nothing in flight, no free blocks held in torch's cache
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        samples = [self._counter.used()]
        if self._base is None:
            self._base = samples[0]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.001):
                samples.append(self._counter.used())

        self._allocator.start()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            load()
            torch.cuda.synchronize()
        finally:
            done.set()
            sampler.join()
        self._allocator.stop()
        samples.append(self._counter.used())
        self.peak = max(self.peak or 0, max(samples) - self._base)


class MallocMemory:
    """Bytes glibc's malloc has handed out and not taken back (mallinfo2), read before and after each load.
    AOTI's blobs (std::malloc) and torch's CPU tensors (posix_memalign) come from it, Python's small objects
    do not; unlike resident memory it also sees freed memory being reused. None off glibc."""

    name = "glibc malloc in-use bytes (mallinfo2)"
    resolution = 1 << 20
    """Far above what Python and torch bookkeeping allocate while a method loads."""
    alongside = ""

    def __init__(self) -> None:
        self._base: int | None = None
        self.peak: int | None = None

    def around(self, load: Callable[[], object]) -> None:
        before = malloced_bytes()
        if self._base is None:
            self._base = before
        load()
        after = malloced_bytes()
        if self._base is not None and after is not None:
            self.peak = max(self.peak or 0, after - self._base)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (f, ctypes.c_size_t)
        for f in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def malloced_bytes() -> int | None:
    """Bytes in use in malloc's arenas plus its mmapped chunks."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except AttributeError:
        return None
    mallinfo2.restype = _Mallinfo2
    info = mallinfo2()
    return int(info.uordblks + info.hblkhd)
