"""A runtime of .pte files (pytest_ptn.backends.pte_runtime) runs every lowering it supports, and each of its
failures says whose it is: executorch.runtime on the same .pte gives the same values (the lowering's) or
eager's (the runtime's own), and the causes lead with the runtime's. In check_program too, and for a runtime
in another interpreter (tests/remote_runtimes.py) as for one in this process."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

from pytest_ptn.backend import LOWERING_FAULT, RUNTIME_FAULT, resolve_backend
from pytest_ptn.check import check_program
from pytest_ptn.plugin import suite_path, variants


def test_a_runtime_stands_for_every_lowering() -> None:
    assert variants(["pte_runtimes:ExecutorchRuntime"]) == [
        f"pte_runtimes:ExecutorchRuntime@{lowering}"
        for lowering in ("portable", "shared-state", "external", "xnnpack")
    ]
    cls = resolve_backend("pte_runtimes:ExecutorchRuntime@shared-state")
    assert cls.name == "et-runtime@shared-state" and cls.lowering == "shared-state"


def _run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, backends: list[str], rules: str, *args: str
) -> pytest.RunResult:
    """A run of the ``rules`` tests on kv_cache. In a process of its own: a second lowering in one process
    (pytester drops what a run imported) registers executorch's TORCH_LIBRARY again."""
    tests = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))
    return pytester.runpytest_subprocess(
        str(suite_path()),
        *[f"--ptn-backend={backend}" for backend in backends],
        "--ptn-no-expectations",
        "-m",
        rules,
        "-k",
        "kv_cache and not bf16 and not fp16",
        "-p",
        "no:cacheprovider",
        *args,
    )


def _failures(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, backend: str) -> list[str]:
    """The failures' lines and causes of a run of the E1 and E3 tests on kv_cache."""
    result = _run(pytester, monkeypatch, [backend], "E1 or E3")
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


IN_ANOTHER_INTERPRETER = {
    "remote_runtimes:RemoteIgnoresSharedBuffers@shared-state": (
        "pte_runtimes:IgnoresSharedBuffers@shared-state",
        RUNTIME_FAULT,
    ),
    "remote_runtimes:RemoteRuntime@portable": ("pte_runtimes:ExecutorchRuntime@portable", LOWERING_FAULT),
}
"""A runtime in another interpreter (its load_pte hands the .pte's bytes to a worker process) -> the same
runtime in this process, and whose its failures are."""


def test_a_runtime_in_another_interpreter_is_judged_as_one_in_this_process(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every verdict of the E3 tests on kv_cache, its text and attribution included, is the same for the
    runtime in a worker process as for it in this one."""
    backends = [spec for remote, (here, _) in IN_ANOTHER_INTERPRETER.items() for spec in (remote, here)]
    _run(pytester, monkeypatch, backends, "E3", "--ptn-report", "out")
    rows = json.loads((pytester.path / "out" / "results.json").read_text())["results"]
    verdicts: dict[str, set[tuple[str, str, str]]] = {}
    for r in rows:
        verdicts.setdefault(r["backend"], set()).add((r["schedule"], r["outcome"], r["reason"]))
    for remote, (here, whose) in IN_ANOTHER_INTERPRETER.items():
        assert verdicts[remote] == verdicts[here], (remote, verdicts)
        assert len(verdicts[here]) == 2, verdicts[here]  # both schedules
        assert all(outcome == "fail" and f": {whose}\n" in reason for _, outcome, reason in verdicts[here])


class KVCache(torch.nn.Module):
    """A cache prefill writes and decode reads: one buffer of both methods."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(4))

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        self.cache.add_(x)
        return self.cache * 1

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return self.cache + x


@pytest.mark.parametrize(
    ("backend", "whose"),
    [
        ("pte_runtimes:IgnoresSharedBuffers@shared-state", RUNTIME_FAULT),
        ("pte_runtimes:ExecutorchRuntime@portable", LOWERING_FAULT),
    ],
)
def test_check_program_says_whose_each_failure_is(backend: str, whose: str) -> None:
    """As the suite's failures do: a runtime that ignores share_mutable_buffers gives decode a private copy
    where executorch.runtime gives eager's values (the runtime's own); the portable lowering's private
    copies are what executorch.runtime gives too (the lowering's)."""
    methods = {"prefill": (torch.ones(4),), "decode": (torch.ones(4),)}
    findings = check_program(KVCache(), methods, backend=backend)
    wrong = [f for f in findings if f.rule == "E1"]
    assert wrong and all(f.method == "decode" for f in wrong), [str(f) for f in findings]
    assert all(f.whose is not None and f.whose.endswith(f": {whose}") for f in wrong), [str(f) for f in wrong]
    assert all(str(f).endswith(f": {whose}") for f in wrong)


def test_the_fuzz_says_whose_an_error_is(tmp_path: Path) -> None:
    """An error on a generated program says whether executorch.runtime on the same .pte raises too (the
    lowering's) or runs every call (the runtime's own): a runtime that refuses every call is its own."""
    from pte_runtimes import ExecutorchRuntime, _Executorch

    from pytest_ptn.fuzzing.verdict import verdict_on
    from pytest_ptn.spec import Constant, Method, ProgramSpec

    class _Refuses(_Executorch):
        def run(self, method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            raise RuntimeError(f"execute('{method}') failed")

    class Refuses(ExecutorchRuntime):
        name = "refuses"

        def load_pte(self, program: Path, data: Path | None) -> _Refuses:
            return _Refuses(program, data)

    spec = ProgramSpec(
        methods=(
            Method("prefill", (Constant("w", "parameter", seed=1),), reads=("w",)),
            Method("decode", (Constant("w", "parameter", seed=2),), reads=("w",)),
        )
    )
    with warnings.catch_warnings():  # upstream's (executorch.runtime is experimental), as the plugin's are
        warnings.simplefilter("ignore")
        verdict = verdict_on(Refuses.variant("portable")(), spec, tmp_path)
    assert verdict.keys == ["error:running:RuntimeError: execute('…') failed"], verdict.message
    assert f"executorch.runtime on the same .pte runs every call: {RUNTIME_FAULT}" in verdict.message
    assert RUNTIME_FAULT in verdict.mechanisms[0].detail


def test_an_accuracy_failure_says_whose_it_is_too(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A1 as E1 (issue 60): executorch's lowering elides a reshape of a cond's result, so the method alone
    differs from eager; executorch.runtime on the same .pte gives the same values, so it is the lowering's."""
    tests = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))
    pytester.runpytest_subprocess(
        str(suite_path()),
        "--ptn-backend=pte_runtimes:ExecutorchRuntime@portable",
        "--ptn-no-expectations",
        "-m",
        "A1",
        "-k",
        "cond_constants",
        "-p",
        "no:cacheprovider",
        "--ptn-report",
        "out",
    )
    rows = json.loads((pytester.path / "out" / "results.json").read_text())["results"]
    failed = [r for r in rows if r["rule"] == "A1" and r["outcome"] == "fail"]
    assert failed and all(f": {LOWERING_FAULT}" in r["reason"] for r in failed), rows


def test_executorch_s_own_runtime_is_never_blamed_and_one_upstream_bug_is_one_cause(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """executorch.runtime wrapped as a third-party runtime has every upstream bug and none of its own: over
    the scenarios where executorch's lowerings fail (a cond's reshape elided, state re-initialised on a late
    load), on two lowerings, no cause blames the runtime, every cause says whose it is (as data:
    results.json's ``whose``), and a bug that shows on both lowerings is one cause naming both (issue 60)."""
    tests = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))
    lowerings = ("portable", "shared-state")
    pytester.runpytest_subprocess(
        str(suite_path()),
        *[f"--ptn-backend=pte_runtimes:ExecutorchRuntime@{lowering}" for lowering in lowerings],
        "--ptn-no-expectations",
        "-k",
        "(cond_constants or kv_cache) and not bf16 and not fp16 and not fuzz",
        "-p",
        "no:cacheprovider",
        "--ptn-report",
        "out",
    )
    data = json.loads((pytester.path / "out" / "results.json").read_text())
    failed = [r for r in data["results"] if r["outcome"] == "fail"]
    assert failed, "executorch's lowerings fail nothing here any more: pick scenarios they still fail"
    assert all(r["whose"] == "lowering" for r in failed), [(r["nodeid"], r["whose"]) for r in failed]
    found = data["causes"]
    assert all(RUNTIME_FAULT not in c["summary"] and LOWERING_FAULT in c["summary"] for c in found), found
    both = {f"pte_runtimes:ExecutorchRuntime@{lowering}" for lowering in lowerings}
    assert any(set(c["backend"].split(", ")) == both for c in found), found  # the cond's elided reshape
    assert len({c["summary"] for c in found}) == len(found), found
