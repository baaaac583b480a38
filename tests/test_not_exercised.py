"""A delegate whose partitioner takes nothing passes every isolation test on the merits of the portable
kernels around it: such a test is reported "not exercised", never passed (Spec v6;
pytest_ptn.run.not_exercised). What a backend holds comes from the lowered program (``Lowered.ownership``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_ptn.backends.pte import PteBackend
from pytest_ptn.reporting import results
from pytest_ptn.ruleset import JUDGE_HELD_CONSTANTS

TESTS = Path(__file__).parent


class TakesNothing:
    """A correct partitioner that tags no node: every method runs on the portable kernels."""

    def __new__(cls) -> Any:
        from executorch.exir.backend.partitioner import Partitioner, PartitionResult

        class _TakesNothing(Partitioner):
            def partition(self, exported_program: torch.export.ExportedProgram) -> PartitionResult:
                return PartitionResult(tagged_exported_program=exported_program, partition_tags={})

        return _TakesNothing()


class EmptyDelegate(PteBackend):
    """The pte backend with a delegate whose partitioner takes nothing, named ``pte`` so that pte's known
    failures are expected of it too: what runs the program is pte's portable path."""

    name = "pte"

    def partitioners(self, method: str) -> list[Any]:
        return [TakesNothing()]


def run_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, scope: str) -> pytest.RunResult:
    """The suite on EmptyDelegate, its report in ``out``."""
    from pytest_ptn.plugin import suite_path

    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    backend = "--ptn-backend=test_not_exercised:EmptyDelegate"
    return pytester.runpytest_subprocess(
        str(suite_path()), backend, "-k", scope, "-p", "no:cacheprovider", "--ptn-report", "out"
    )


def test_an_empty_partitioner_is_not_exercised_on_every_isolation_and_sharing_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    scope = "not fuzz and (colliding_scalars or shared_weight or kv_cache or private_same_shape_buffers)"
    result = run_suite(pytester, monkeypatch, scope)
    rows = results.load(pytester.path / "out" / "results.json").results
    judged = [r for r in rows if r.rule in JUDGE_HELD_CONSTANTS]
    assert not [r.nodeid for r in judged if r.outcome == results.PASS]
    unexercised = {r.rule for r in judged if r.outcome == results.NOT_EXERCISED}
    assert {"E1", "E5", "A1"} <= unexercised, unexercised  # E3 and E4 fail there: pte's known bugs
    assert result.ret == pytest.ExitCode.OK  # pte's known failures, expected
    assert all(r.owned is not None and r.owned[0] == 0 < r.owned[1] for r in judged if r.owned)
    result.stdout.fnmatch_lines(["*:EmptyDelegate held 0 of * checked constants (0%)*not exercised*"])
    result.stdout.fnmatch_lines(["ptn: *:EmptyDelegate held none of the constants its tests checked*"])


def test_a_fuzz_whose_programs_an_empty_partitioner_took_nothing_of_is_not_exercised(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run_suite(pytester, monkeypatch, "fuzz")
    (fuzz,) = results.load(pytester.path / "out" / "results.json").results
    assert fuzz.outcome == results.NOT_EXERCISED and fuzz.fuzz is not None, fuzz.reason
    assert 0 < fuzz.fuzz.known <= fuzz.fuzz.programs and fuzz.fuzz.exercising == 0
    said = "fuzz on *:EmptyDelegate: * programs, * clean, 0 of * (0%) with a constant*"
    result.stdout.fnmatch_lines([said])


def test_a_delegate_holds_the_weights_its_partitioner_took_and_leaves_the_rest(tmp_path: Path) -> None:
    """XNNPACK takes a linear layer's weight; a buffer added to its output stays with the portable
    kernels; without partitioners, the runtime under test holds them all."""
    from pytest_ptn.backends.pte import XnnpackBackend

    class Method(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4, bias=False)
            self.register_buffer("offset", torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x) + self.offset

    def exported() -> dict[str, torch.export.ExportedProgram]:
        return {"forward": torch.export.export(Method().eval(), (torch.randn(1, 4),))}

    delegated = XnnpackBackend().lower(exported(), tmp_path).ownership()
    assert delegated is not None
    assert (delegated.owned, delegated.left) == (
        {"forward": frozenset({"linear.weight"})},
        {"forward": frozenset({"offset"})},
    )
    assert delegated.counts() == (1, 2)
    (tmp_path / "portable").mkdir()
    portable = PteBackend().lower(exported(), tmp_path / "portable").ownership()
    assert portable is not None and portable.counts() == (2, 2)
    assert json.dumps(portable.counts()) == "[2, 2]"
