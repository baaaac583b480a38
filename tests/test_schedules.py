"""Load schedules: the E rules hold with every method loaded up front and with each loaded at its first call,
and a failure under one names it."""

from __future__ import annotations

import pytest
import torch

from pytest_ptn.check import check_program
from pytest_ptn.plugin import suite_path
from pytest_ptn.programs.source import ProgramFormError
from pytest_ptn.schedule import LoadSchedule


def test_schedules_load_before_the_right_calls() -> None:
    sequence = ["prefill", "decode", "prefill", "decode"]
    assert LoadSchedule.UP_FRONT.loads(["prefill", "decode"], sequence) == [["prefill", "decode"], [], [], []]
    assert LoadSchedule.AT_FIRST_CALL.loads(["prefill", "decode"], sequence) == [
        ["prefill"],
        ["decode"],
        [],
        [],
    ]
    assert LoadSchedule.AT_FIRST_CALL.describe(sequence) == (
        "methods loaded at their first call: decode loaded after prefill ran"
    )


def test_a_reset_at_late_load_fails_at_first_call_only(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess(
        str(suite_path()),
        "--ptn-backend=broken_backends:ReinitOnLateLoad",
        "-m",
        "E1 or E3",
        "-k",
        "kv_cache_in_bf16 or equal_bytes_state",
        "-p",
        "no:cacheprovider",
        "-rf",
    )
    failed = [line for line in result.outlines if line.startswith("FAILED")]
    assert failed and all("at_first_call" in line for line in failed), failed
    assert result.parseoutcomes().get("passed", 0) >= 4  # the up-front runs
    result.stdout.fnmatch_lines(["*decode loaded after prefill ran*"])


class KvModel(torch.nn.Module):
    def __init__(self, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, dtype=dtype))
        self.weight = torch.nn.Parameter(
            torch.randn(4, 4, dtype=dtype, generator=torch.Generator().manual_seed(0))
        )

    def prefill(self, x):
        self.cache.add_(x @ self.weight)
        return x @ self.weight

    def decode(self, x):
        return x @ self.weight + self.cache


def _kv_calls(dtype: torch.dtype) -> tuple[dict, list]:
    x = torch.arange(4.0).to(dtype)
    y = torch.linspace(-1, 1, 4).to(dtype)
    return {"prefill": (x,), "decode": (y,)}, [("prefill", (x,)), ("decode", (y,)), ("decode", (x,))]


def test_check_program_names_the_late_load() -> None:
    from broken_backends import ReinitOnLateLoad

    methods, calls = _kv_calls(torch.float32)
    findings = check_program(KvModel(), methods, calls=calls, backend=ReinitOnLateLoad())
    assert findings, "a reset at a late load_method went unseen"
    assert all("decode loaded after prefill ran" in str(f) for f in findings), findings
    assert not check_program(KvModel(), methods, calls=calls, backend="reference")


def test_check_program_on_bf16_is_clean_on_reference() -> None:
    methods, calls = _kv_calls(torch.bfloat16)
    assert not check_program(KvModel(torch.bfloat16), methods, calls=calls, backend="reference")


def test_a_call_the_method_cannot_take_is_a_usage_error() -> None:
    methods, _ = _kv_calls(torch.float32)
    with pytest.raises(
        ProgramFormError, match=r"call #1 cannot be made: method 'decode' takes input 0 as shape \(4,\)"
    ):
        check_program(
            KvModel(), methods, calls=[("prefill", methods["prefill"]), ("decode", (torch.ones(6),))]
        )


def test_the_reference_loader_refuses_such_a_call(tmp_path) -> None:
    from pytest_ptn.backends.reference import ReferenceBackend
    from pytest_ptn.reference.inputs import CallRefused

    backend = ReferenceBackend()
    methods, _ = _kv_calls(torch.float32)
    programs = {
        m: torch.export.export(_view(KvModel(), m), args, strict=False) for m, args in methods.items()
    }
    loaded = backend.load(backend.lower(programs, tmp_path))
    with pytest.raises(CallRefused, match="method 'prefill' takes input 0 as shape"):
        loaded.run("prefill", [torch.ones(1, 4)])
    with pytest.raises(CallRefused, match="torch.float32, not"):
        loaded.run("prefill", [torch.ones(4, dtype=torch.float64)])
    assert loaded.run("prefill", [torch.ones(4)])


def _view(model: torch.nn.Module, method: str) -> torch.nn.Module:
    from pytest_ptn.programs.source import method_view

    return method_view(model, method)
