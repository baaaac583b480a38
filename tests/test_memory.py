"""Which NVML probe S6 reads on CUDA, chosen against a fake pynvml, and the caching allocator's counters
read beside it: both run on CPU machines, where no driver exists to choose for real."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from pytest_ptn.instruments.memory import AllocatorCounters, NvmlCounter

PID = 4242


class NVMLError(Exception):
    pass


def fake_pynvml(processes: list[Any] | NVMLError, device_used: int = 7 << 30) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")

    def running(handle: object) -> list[Any]:
        if isinstance(processes, NVMLError):
            raise processes
        return processes

    nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
    nvml.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: uuid  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetComputeRunningProcesses = running  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(used=device_used)  # type: ignore[attr-defined]
    return nvml


def process(pid: int, used: int | None) -> types.SimpleNamespace:
    return types.SimpleNamespace(pid=pid, usedGpuMemory=used)


def counter(monkeypatch: pytest.MonkeyPatch, nvml: types.ModuleType) -> NvmlCounter:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return NvmlCounter("GPU-fake", pid=PID)


def test_the_process_is_read_where_the_driver_lists_it(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = counter(monkeypatch, fake_pynvml([process(1, 5 << 30), process(PID, 3 << 20)]))
    assert probe.per_process
    assert probe.name.startswith("NVML usedGpuMemory of this process")
    assert probe.used() == 3 << 20


@pytest.mark.parametrize(
    ("processes", "why"),
    [
        ([process(1, 5 << 30)], f"does not list pid {PID}"),
        ([], f"does not list pid {PID}"),
        ([process(PID, None)], f"lists pid {PID} without its usedGpuMemory"),
        (NVMLError("Not Supported"), "lists no processes: Not Supported"),
    ],
    ids=["other-processes-only", "none-listed", "no-number", "not-supported"],
)
def test_the_device_is_read_where_the_process_is_hidden(
    monkeypatch: pytest.MonkeyPatch, processes: list[Any] | NVMLError, why: str
) -> None:
    probe = counter(monkeypatch, fake_pynvml(processes, device_used=7 << 30))
    assert not probe.per_process
    assert probe.name.startswith("NVML used memory of the whole device over a baseline read after")
    assert why in probe.name
    assert probe.used() == 7 << 30


def test_allocator_peaks_are_growth_over_the_first_baseline(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    stats = [
        {"allocated_bytes.all.current": 100, "reserved_bytes.all.current": 1000},  # baseline
        {"allocated_bytes.all.peak": 300, "reserved_bytes.all.peak": 5000},  # after the first load
        {"allocated_bytes.all.peak": 250, "reserved_bytes.all.peak": 9000},  # after the second
    ]
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda: stats.pop(0))
    counters = AllocatorCounters()
    for _ in range(2):
        counters.start()
        counters.stop()
    assert (counters.allocated, counters.reserved) == (200, 8000)
    assert "allocated peak grew 200 B, reserved peak grew 8000 B" in str(counters)
