"""The cuda backend where there is no GPU: it must say precisely why it cannot run, and set the delegate's
weight-sharing option through the runtime (shown on XnnpackBackend, which every executorch build has).

Where a CUDA executorch and a GPU exist, the conformance suite itself exercises the backend
(conformance/gpu/nightly.sh); the tests that need it unavailable skip there.
"""

from __future__ import annotations

import sys
import types

import pytest

from pytest_ptn.backends import cuda

unavailable = pytest.mark.skipif(
    cuda.CudaDelegateBackend.availability().available, reason="this machine can run the CUDA delegate"
)


class _NvmlError(Exception):
    pass


def _nvml(*capabilities: tuple[int, int], init_error: str | None = None) -> types.ModuleType:
    """A stand-in for pynvml with one device per compute capability given."""
    nvml = types.ModuleType("pynvml")
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if init_error:
            raise _NvmlError(init_error)

    nvml.NVMLError = _NvmlError  # type: ignore[attr-defined]
    nvml.nvmlInit = init  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: len(capabilities)  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCudaComputeCapability = lambda h: capabilities[h]  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetName = lambda h: f"GPU{h}"  # type: ignore[attr-defined]
    nvml.calls = calls  # type: ignore[attr-defined]
    return nvml


@pytest.mark.parametrize(
    ("nvml", "reason"),
    [
        (
            _nvml(init_error="NVML Shared Library Not Found"),
            "no NVIDIA GPU driver (NVML: NVML Shared Library",
        ),
        (_nvml(), "no NVIDIA GPU (NVML sees none)"),
        (_nvml((7, 5), (6, 1)), "no GPU with compute capability >= 8.0 (found GPU0 (7.5), GPU1 (6.1))"),
        (_nvml((7, 5), (9, 0)), None),
    ],
    ids=["no-driver", "no-gpu", "too-old", "one-usable"],
)
def test_gpu_problem_names_what_nvml_sees(nvml: types.ModuleType, reason: str | None) -> None:
    found = cuda.gpu_problem(nvml)
    if reason is None:
        assert found is None
    else:
        assert found is not None and found.startswith(reason)
    if nvml.calls[0] == "init" and len(nvml.calls) > 1:
        assert nvml.calls[-1] == "shutdown"


def _everything_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda, "executorch_build", lambda: "1.5.1+cu130")
    monkeypatch.setattr(cuda, "package_version", lambda dist: "2.13.0+cu130")
    monkeypatch.setattr(cuda, "gpu_problem", lambda nvml: None)
    monkeypatch.setattr(cuda, "_nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    real = cuda.importlib.util.find_spec
    present = {"pynvml": real("json"), "triton": real("json")}
    monkeypatch.setattr(cuda.importlib.util, "find_spec", lambda name: present.get(name) or real(name))
    monkeypatch.setitem(sys.modules, "pynvml", _nvml((9, 0)))


def test_nothing_missing_means_available(monkeypatch: pytest.MonkeyPatch) -> None:
    _everything_present(monkeypatch)
    assert cuda.missing_requirements() == []
    availability = cuda.CudaDelegateBackend.availability()
    assert availability.available, availability.reason
    assert availability.versions == {"executorch": "2.13.0+cu130", "torch": "2.13.0+cu130"}


@pytest.mark.parametrize(
    ("missing", "reason"),
    [
        ("executorch", "executorch is not installed"),
        ("cpu-executorch", "executorch 1.5.1+cpu is the CPU-only build, without CudaBackend"),
        ("cpu-torch", "torch 2.13.0+cpu is a CPU-only build"),
        ("pynvml", "nvidia-ml-py is not installed"),
        ("gpu", "no NVIDIA GPU (NVML sees none)"),
        ("triton", "triton is not installed"),
        ("nvcc", "no nvcc on PATH or in $CUDA_HOME/bin"),
    ],
)
def test_each_missing_requirement_is_named(
    monkeypatch: pytest.MonkeyPatch, missing: str, reason: str
) -> None:
    _everything_present(monkeypatch)
    if missing == "executorch":
        monkeypatch.setattr(cuda, "executorch_build", lambda: None)
    elif missing == "cpu-executorch":
        monkeypatch.setattr(cuda, "executorch_build", lambda: "1.5.1+cpu")
    elif missing == "cpu-torch":
        monkeypatch.setattr(cuda, "package_version", lambda dist: "2.13.0+cpu")
    elif missing == "gpu":
        monkeypatch.setattr(cuda, "gpu_problem", lambda nvml: "no NVIDIA GPU (NVML sees none)")
    elif missing == "nvcc":
        monkeypatch.setattr(cuda, "_nvcc", lambda: None)
    else:
        find = cuda.importlib.util.find_spec
        monkeypatch.setattr(
            cuda.importlib.util, "find_spec", lambda name: None if name == missing else find(name)
        )
    availability = cuda.CudaDelegateBackend.availability()
    assert not availability.available
    assert availability.reason.startswith(reason), availability.reason
    assert availability.reason.endswith("(see conformance/gpu/README.md)")
    assert ";" not in availability.reason, "exactly one thing is missing"


def test_executorch_build_reads_the_build_tag() -> None:
    build = cuda.executorch_build()
    pytest.importorskip("executorch")
    import executorch.version

    assert build == executorch.version.__version__


@unavailable
def test_requesting_it_where_it_cannot_run_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--ptn-backend=cuda", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    reason = cuda.CudaDelegateBackend.availability().reason
    result.stderr.fnmatch_lines([f"ERROR: --ptn-backend=cuda is unavailable on this machine: {reason}"])


def test_a_backend_option_set_through_the_runtime_reads_back() -> None:
    pytest.importorskip("executorch")
    from pytest_ptn.backends.executorch_runtime import get_backend_option, set_backend_option

    before = get_backend_option("XnnpackBackend", "workspace_sharing_mode", 0)
    assert isinstance(before, int)
    try:
        set_backend_option("XnnpackBackend", "workspace_sharing_mode", 1 if before != 1 else 2)
        assert get_backend_option("XnnpackBackend", "workspace_sharing_mode", 0) == (1 if before != 1 else 2)
    finally:
        set_backend_option("XnnpackBackend", "workspace_sharing_mode", before)
    assert get_backend_option("XnnpackBackend", "workspace_sharing_mode", 0) == before


def test_bad_backend_options_are_refused() -> None:
    from pytest_ptn.backends.executorch_runtime import set_backend_option

    with pytest.raises(ValueError, match="longer than 63 bytes"):
        set_backend_option("XnnpackBackend", "k" * 64, 1)
    with pytest.raises(ValueError, match="at most 255 bytes"):
        set_backend_option("XnnpackBackend", "key", "v" * 256)


@unavailable
def test_weight_sharing_cannot_be_set_without_the_delegate() -> None:
    pytest.importorskip("executorch")
    with pytest.raises(RuntimeError, match=r"does not register CudaBackend .*error 0x20 NotFound"):
        cuda.share_weights_across_methods()
