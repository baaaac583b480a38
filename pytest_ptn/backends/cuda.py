"""The ``cuda`` backend: the ExecuTorch CUDA delegate end to end.

Every method is lowered with its own ``CudaPartitioner`` (the compile spec names the method, as upstream's
multi-method exports do), written as ``.pte`` + ``.ptd`` and loaded through ``executorch.runtime`` with
``CudaBackend``'s ``weight_sharing_across_methods`` option set before the first program loads, the way
ExecuTorch's C++ runners share weights between prefill and decode.

Capabilities: EXECUTE and MEMORY. The delegate shows no per-constant storage from Python, so S1-S5 are
judged through what the methods compute (E1); S6 reads NVML while a fresh process loads every method, since
the delegate's weight cache belongs to the process and would otherwise start warm.

Only a CUDA build of executorch registers ``CudaBackend``: ``availability`` names everything missing (GPU,
driver, CUDA wheels, triton, nvcc, nvidia-ml-py) without importing torch or executorch.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pytest_ptn import upstream_noise
from pytest_ptn.backend import Availability, Capability, Lowered, MemoryReading, package_version
from pytest_ptn.backends.pte import PteBackend, PteLoaded, PteLowered

if TYPE_CHECKING:
    import torch

MIN_COMPUTE_CAPABILITY = (8, 0)
"""What the ExecuTorch CUDA wheels are built for."""

SETUP = "see conformance/gpu/README.md"


class CudaLoaded(PteLoaded):
    def run(self, method: str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [t.cpu() for t in super().run(method, inputs)]

    def constant_memory(self) -> MemoryReading:
        from pytest_ptn.instruments.isolation import run_isolated
        from pytest_ptn.instruments.memory import DRIVER_PAGE

        lowered = self._lowered
        data = str(lowered.data_path) if lowered.data_path else None
        peak, probe, alongside = run_isolated(
            _load_measured, str(lowered.path), data, sorted(lowered.methods)
        )
        return MemoryReading(
            peak,
            f"{probe} grew {peak} B while a fresh process loaded every method (the delegate's weight cache "
            f"is process-wide); the number includes the methods' kernels and workspaces; {alongside}",
            resolution=DRIVER_PAGE,
        )


class CudaDelegateBackend(PteBackend):
    name = "cuda"
    capabilities = frozenset({Capability.EXECUTE, Capability.MEMORY})

    @classmethod
    def availability(cls) -> Availability:
        problems = missing_requirements()
        if problems:
            return Availability(False, "; ".join(problems) + f" ({SETUP})")
        return Availability(True, versions={d: package_version(d) or "?" for d in ("executorch", "torch")})

    def partitioners(self, method: str) -> list[Any]:
        from executorch.backends.cuda.cuda_backend import CudaBackend
        from executorch.backends.cuda.cuda_partitioner import CudaPartitioner

        return [CudaPartitioner([CudaBackend.generate_method_name_compile_spec(method)])]

    def load(self, lowered: Lowered) -> CudaLoaded:
        assert isinstance(lowered, PteLowered)
        share_weights_across_methods()
        return CudaLoaded(lowered)


@functools.cache
def share_weights_across_methods() -> None:
    """Set the delegate's option once per process, before any program loads (it is read at init)."""
    from pytest_ptn.backends.executorch_runtime import BackendOptionError, set_backend_option

    try:
        set_backend_option("CudaBackend", "weight_sharing_across_methods", True)
    except BackendOptionError as e:
        raise RuntimeError(f"this executorch build does not register CudaBackend ({e}); {SETUP}") from e


def _load_measured(path: str, data_path: str | None, methods: list[str]) -> tuple[int, str, str]:
    """In a fresh process: the peak GPU memory growth while loading every method, the probe's name and the
    counters read beside it."""
    from pytest_ptn.instruments.memory import NvmlMemory

    share_weights_across_methods()
    probe = NvmlMemory()
    with upstream_noise.contained():
        from executorch.runtime import Runtime

        program = Runtime.get().load_program(path, data_path=data_path)
    loaded: list[object] = []  # kept alive: a freed method's memory would be reused by the next one
    for method in methods:
        probe.around(functools.partial(_load_into, loaded, program, method))
    return probe.peak or 0, probe.name, probe.alongside


def _load_into(loaded: list[object], program: Any, method: str) -> None:
    loaded.append(program.load_method(method))


def missing_requirements() -> list[str]:
    """What this machine lacks for the CUDA delegate, each with what to do; empty when nothing is."""
    problems = [p for p in (_executorch_problem(), _torch_problem()) if p]
    if importlib.util.find_spec("pynvml") is None:
        problems.append("nvidia-ml-py is not installed (it finds the GPU and measures its memory)")
    else:
        import pynvml

        problems += [p for p in [gpu_problem(pynvml)] if p]
    if importlib.util.find_spec("triton") is None:
        problems.append("triton is not installed (the CUDA export generates Triton kernels)")
    if _nvcc() is None:
        problems.append("no nvcc on PATH or in $CUDA_HOME/bin (the CUDA export needs the CUDA toolkit)")
    return problems


def _executorch_problem() -> str | None:
    version = executorch_build()
    if version is None:
        return "executorch is not installed"
    if version.endswith("+cpu"):
        return f"executorch {version} is the CPU-only build, without CudaBackend (install the CUDA wheels)"
    return None


def executorch_build() -> str | None:
    """The installed executorch's version with its build tag, read without importing it: the wheel's
    metadata says 1.5.1 for every build, its ``version.py`` says ``1.5.1+cpu`` or ``1.5.1+cu130``."""
    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_file = Path(spec.submodule_search_locations[0]) / "version.py"
    found = (
        re.search(r'__version__\s*=\s*"([^"]+)"', version_file.read_text()) if version_file.exists() else None
    )
    return found.group(1) if found else package_version("executorch") or "?"


def _torch_problem() -> str | None:
    version = package_version("torch") or "?"
    if version.endswith("+cpu"):
        return f"torch {version} is a CPU-only build"
    return None


def gpu_problem(nvml: ModuleType) -> str | None:
    """Why NVML shows no GPU the delegate can use, or None."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        return f"no NVIDIA GPU driver (NVML: {e})"
    try:
        devices = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        if not devices:
            return "no NVIDIA GPU (NVML sees none)"
        found = [
            (tuple(nvml.nvmlDeviceGetCudaComputeCapability(h)), nvml.nvmlDeviceGetName(h)) for h in devices
        ]
        if all(cc < MIN_COMPUTE_CAPABILITY for cc, _ in found):
            seen = ", ".join(f"{name} ({cc[0]}.{cc[1]})" for cc, name in found)
            want = ".".join(map(str, MIN_COMPUTE_CAPABILITY))
            return f"no GPU with compute capability >= {want} (found {seen})"
        return None
    finally:
        nvml.nvmlShutdown()


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    in_home = Path(home, "bin", "nvcc") if home else None
    return shutil.which("nvcc") or (str(in_home) if in_home and in_home.exists() else None)
