"""``--ptn-gpu-per-worker``: xdist worker ``gwI`` sees only GPU ``I mod count``, and ``-n auto`` starts one
worker per GPU.

On a multi-GPU host every worker would otherwise run on GPU 0, and memory rules read there (S6 takes the
device's used memory where NVML shows no process) would count the other workers' allocations. The pin is an
execnet environment setting of each worker's gateway (``popen//env:CUDA_VISIBLE_DEVICES=I``), so it is set
before the worker imports anything, long before torch initialises CUDA; a worker restarted after a crash
reuses its gateway's settings and keeps its predecessor's GPU. GPUs are counted without torch (which would
initialise CUDA in the controller): NVML through nvidia-ml-py, else ``nvidia-smi -L``.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

OPTION = "--ptn-gpu-per-worker"
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


def add_option(group: pytest.OptionGroup) -> None:
    group.addoption(
        OPTION,
        action="store_true",
        dest="ptn_gpu_per_worker",
        help="pin xdist worker gwI to GPU I mod the number of GPUs (CUDA_VISIBLE_DEVICES), and make -n auto "
        "start one worker per GPU; a usage error where there is no NVIDIA GPU",
    )


def count_gpus() -> tuple[int, str]:
    """The number of NVIDIA GPUs on this machine, and how it was counted (or why none was)."""
    try:
        import pynvml
    except ImportError:
        return count_with_nvidia_smi()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return 0, f"NVML: {exc}"
    try:
        return int(pynvml.nvmlDeviceGetCount()), "NVML"
    finally:
        pynvml.nvmlShutdown()


def count_with_nvidia_smi() -> tuple[int, str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0, "no nvidia-ml-py to ask NVML, and no nvidia-smi on PATH"
    try:
        proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return 0, f"nvidia-smi -L: {exc}"
    if proc.returncode != 0:
        return 0, f"nvidia-smi -L: {(proc.stderr or proc.stdout).strip() or f'exit {proc.returncode}'}"
    return sum(line.startswith("GPU ") for line in proc.stdout.splitlines()), "nvidia-smi -L"


def visible_gpus() -> tuple[list[str], str]:
    """The GPUs this run may use, as ``CUDA_VISIBLE_DEVICES`` entries, and how they were found: the entries
    this process was given when it has the variable (a job scheduler's share of the host), else every
    GPU counted."""
    given = os.environ.get(VISIBLE_DEVICES)
    if given is not None:
        return [d.strip() for d in given.split(",") if d.strip()], f"{VISIBLE_DEVICES}={given}"
    count, source = count_gpus()
    return [str(i) for i in range(count)], source


def auto_workers(config: pytest.Config) -> int | None:
    """What ``-n auto`` means with the option: one worker per GPU (None without the option or a GPU)."""
    if not config.getoption("ptn_gpu_per_worker"):
        return None
    return len(visible_gpus()[0]) or None


def configure(config: pytest.Config) -> None:
    """On the controller: give worker ``gwI`` the environment setting of its GPU, or refuse the run."""
    if not config.getoption("ptn_gpu_per_worker") or hasattr(config, "workerinput"):
        return
    if not config.getoption("tx", None):
        raise pytest.UsageError(
            f"{OPTION} pins xdist workers to GPUs, and this run has none: give -n auto or -n N "
            "(not -n 0, --pdb or -p no:xdist)"
        )
    gpus, source = visible_gpus()
    if not gpus:
        raise pytest.UsageError(f"{OPTION}: no NVIDIA GPU on this machine ({source})")
    from xdist.workermanage import parse_tx_spec_config

    specs = parse_tx_spec_config(config)  # one per worker, in the order they become gw0, gw1, ...
    pinned = [gpus[i % len(gpus)] for i in range(len(specs))]
    config.option.tx = [
        f"{spec}//env:{VISIBLE_DEVICES}={gpu}" for spec, gpu in zip(specs, pinned, strict=True)
    ]
    config.pluginmanager.register(GpuPinning(pinned, source), "ptn-gpu-per-worker")


class GpuPinning:
    """Shows the worker to GPU mapping in the header."""

    def __init__(self, pinned: list[str], source: str):
        self.pinned = pinned
        self.source = source

    def pytest_report_header(self) -> str:
        mapping = ", ".join(f"gw{i} -> {gpu}" for i, gpu in enumerate(self.pinned))
        return (
            f"ptn: one GPU per xdist worker ({OPTION}; GPUs from {self.source}): {VISIBLE_DEVICES} {mapping}"
        )
