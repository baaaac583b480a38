"""A runtime of .pte files (pytest_ptn.backends.pte_runtime) runs every lowering it supports, and each of its
failures says whose it is: executorch.runtime on the same .pte gives the same values (the lowering's) or
eager's (the runtime's own), and the causes lead with the runtime's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_ptn.backend import LOWERING_FAULT, RUNTIME_FAULT, resolve_backend
from pytest_ptn.plugin import suite_path, variants


def test_a_runtime_stands_for_every_lowering() -> None:
    assert variants(["pte_runtimes:ExecutorchRuntime"]) == [
        f"pte_runtimes:ExecutorchRuntime@{lowering}"
        for lowering in ("portable", "shared-state", "external", "xnnpack")
    ]
    cls = resolve_backend("pte_runtimes:ExecutorchRuntime@shared-state")
    assert cls.name == "et-runtime@shared-state" and cls.lowering == "shared-state"


def _failures(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, backend: str) -> list[str]:
    """The failures' lines and causes of a run of the E1 and E3 tests on kv_cache. In a process of its own:
    a second lowering in one process (pytester drops what a run imported) registers executorch's
    TORCH_LIBRARY again."""
    tests = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))
    result = pytester.runpytest_subprocess(
        str(suite_path()),
        f"--ptn-backend={backend}",
        "--ptn-no-expectations",
        "-m",
        "E1 or E3",
        "-k",
        "kv_cache and not bf16 and not fp16",
        "-p",
        "no:cacheprovider",
    )
    return [line for line in result.stdout.lines if line.startswith(("  call #", "  cause"))]


@pytest.mark.parametrize(
    ("backend", "whose"),
    [
        ("pte_runtimes:IgnoresSharedBuffers@shared-state", RUNTIME_FAULT),
        ("pte_runtimes:ForgetsState@shared-state", RUNTIME_FAULT),
        ("pte_runtimes:ExecutorchRuntime@portable", LOWERING_FAULT),
    ],
)
def test_each_failure_says_whose_it_is(
    backend: str, whose: str, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = _failures(pytester, monkeypatch, backend)
    calls = [line for line in lines if line.startswith("  call #")]
    assert calls and all(line.endswith(f": {whose}") for line in calls), lines
    assert any(line.startswith("  cause 1 ") and whose in line for line in lines), lines


def test_a_correct_runtime_passes_where_executorch_runtime_does(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _failures(pytester, monkeypatch, "pte_runtimes:ExecutorchRuntime@shared-state") == []
