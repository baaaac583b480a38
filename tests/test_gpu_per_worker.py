"""``--ptn-gpu-per-worker`` on a CPU machine: the GPU count is faked in the (in-process) controller; the
workers report the ``CUDA_VISIBLE_DEVICES`` they started with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_ptn.scheduling import gpus

WORKERS_REPORT_THEIR_GPU = """
import os
from pathlib import Path


def pytest_configure(config):
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        seen = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
        Path({folder!r}, workerinput["workerid"]).write_text(seen)
"""


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """Makes the controller count that many GPUs, with no CUDA_VISIBLE_DEVICES of its own."""
    monkeypatch.delenv(gpus.VISIBLE_DEVICES, raising=False)

    def fake(count: int) -> None:
        monkeypatch.setattr(gpus, "count_gpus", lambda: (count, "faked by the test"))

    return fake


def worker_gpus(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, str]]:
    folder = pytester.mkdir("seen")
    pytester.makeconftest(WORKERS_REPORT_THEIR_GPU.format(folder=str(folder)))
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest("--ptn-gpu-per-worker", "-p", "no:cacheprovider", *args)
    return result, {p.name: p.read_text() for p in Path(folder).iterdir()}


def test_workers_are_pinned_round_robin(pytester: pytest.Pytester, fake_gpus: Callable[[int], None]) -> None:
    fake_gpus(2)
    result, seen = worker_gpus(pytester, "-n", "3")
    assert result.ret == 0
    assert seen == {"gw0": "0", "gw1": "1", "gw2": "0"}
    result.stdout.fnmatch_lines(
        [
            "ptn: one GPU per xdist worker (--ptn-gpu-per-worker; GPUs from faked by the test): "
            "CUDA_VISIBLE_DEVICES gw0 -> 0, gw1 -> 1, gw2 -> 0"
        ]
    )


def test_n_auto_means_one_worker_per_visible_gpu(
    pytester: pytest.Pytester, fake_gpus: Callable[[int], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_gpus(8)  # the host's GPUs; this job was given two of them
    monkeypatch.setenv(gpus.VISIBLE_DEVICES, "5,7")
    result, _ = worker_gpus(pytester, "-n", "auto", "--collect-only")  # the header, without workers
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "ptn: one GPU per xdist worker (*GPUs from CUDA_VISIBLE_DEVICES=5,7): "
            "CUDA_VISIBLE_DEVICES gw0 -> 5, gw1 -> 7"
        ]
    )


@pytest.mark.parametrize("workers", ["2", "auto"])
def test_no_gpu_is_a_usage_error(
    pytester: pytest.Pytester, fake_gpus: Callable[[int], None], workers: str
) -> None:
    fake_gpus(0)
    result, seen = worker_gpus(pytester, "-n", workers)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.str().strip() == (
        "ERROR: --ptn-gpu-per-worker: no NVIDIA GPU on this machine (faked by the test)"
    )
    assert seen == {}


def test_an_in_process_run_has_no_worker_to_pin(
    pytester: pytest.Pytester, fake_gpus: Callable[[int], None]
) -> None:
    fake_gpus(1)
    result, _ = worker_gpus(pytester, "-n", "0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --ptn-gpu-per-worker pins xdist workers to GPUs, and this run has none*"]
    )
