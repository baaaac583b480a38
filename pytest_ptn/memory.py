"""Memory growth while something loads: one probe protocol, measured by NVML on a GPU, by malloc on the host.

NVML (nvidia-ml-py): torch's own counters see only its caching allocator: not AOTI's constant blobs (raw
``cudaMalloc``), nor anything the ExecuTorch CUDA delegate allocates. NVML sees the whole process, where the
driver reports it: inside a container without the host PID namespace no PID matches, and the device's used
memory is taken instead (run on an otherwise idle GPU). NVML keeps no peak, so a thread samples it every
millisecond while loading, which can miss a shorter spike.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import Protocol

DRIVER_PAGE = 2 << 20
"""The granularity NVML's numbers move in: the driver maps device memory in 2 MiB pages."""


class MemoryProbe(Protocol):
    """Peak growth, over the baseline of the first ``around`` call, while the loads it wrapped ran."""

    name: str
    """What is measured, for the report."""
    resolution: int
    """The smallest growth the probe can see."""
    peak: int | None
    """None until a load was measured (or where the probe cannot measure)."""

    def around(self, load: Callable[[], object]) -> None: ...


class NvmlMemory:
    """Peak growth over the first ``around`` call's baseline, on the GPU torch uses."""

    def __init__(self, resolution: int = DRIVER_PAGE) -> None:
        import pynvml
        import torch

        torch.empty(1, device="cuda")  # the CUDA context exists before the baseline
        pynvml.nvmlInit()
        uuid = torch.cuda.get_device_properties(torch.cuda.current_device()).uuid
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        self._per_process = self._process_bytes() is not None
        self.name = "NVML " + ("usedGpuMemory of this process" if self._per_process else "device used memory")
        self.resolution = resolution
        self._base: int | None = None
        self.peak: int | None = None

    def _process_bytes(self) -> int | None:
        return next(
            (
                p.usedGpuMemory
                for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
                if p.pid == os.getpid()
            ),
            None,
        )

    def _used(self) -> int:
        if self._per_process:
            return self._process_bytes() or 0
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def around(self, load: Callable[[], object]) -> None:
        import torch

        samples = [self._used()]
        if self._base is None:
            self._base = samples[0]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.001):
                samples.append(self._used())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            load()
            torch.cuda.synchronize()
        finally:
            done.set()
            sampler.join()
        samples.append(self._used())
        self.peak = max(self.peak or 0, max(samples) - self._base)


class MallocMemory:
    """Bytes glibc's malloc has handed out and not taken back (mallinfo2), read before and after each load.
    AOTI's blobs (std::malloc) and torch's CPU tensors (posix_memalign) come from it, Python's small objects
    do not; unlike resident memory it also sees freed memory being reused. None off glibc."""

    name = "glibc malloc in-use bytes (mallinfo2)"
    resolution = 1 << 20
    """Far above what Python and torch bookkeeping allocate while a method loads."""

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
