"""P rules: how a package names, stores and shares the constants of a multi-method program."""

from __future__ import annotations

import math
import time

import pytest
import torch
from torch import nn

from pytest_ptn.backend import Backend, Capability
from pytest_ptn.check.package import (
    dedupe_findings,
    namespace_findings,
    reference_findings,
    state_alias_findings,
)
from pytest_ptn.harness import Case, fail_with
from pytest_ptn.programs.exported import constants_of
from pytest_ptn.programs.user import NamedProgram
from pytest_ptn.run.not_applicable import skip_not_applicable

pytestmark = pytest.mark.ptn_scenarios("valid")

ZIP_TIME_STEP = 2
"""The resolution of a zip member's timestamp, in seconds: stamps in one even-second step are equal."""


@pytest.mark.P1
def test_immutable_constants_live_in_their_method_namespace(ptn_case: Case) -> None:
    view = ptn_case.lower().package()
    wrong = [str(f) for f in namespace_findings(view, ptn_case.exported()) if f.rule == "P1"]
    fail_with(wrong)


@pytest.mark.P2
def test_mutated_keys_are_one_state_entry(ptn_case: Case) -> None:
    view = ptn_case.lower().package()
    wrong = [str(f) for f in namespace_findings(view, ptn_case.exported()) if f.rule == "P2"]
    fail_with(wrong)


@pytest.mark.P3
def test_every_reference_is_rewritten_and_resolves(ptn_case: Case) -> None:
    wrong = [str(f) for f in reference_findings(ptn_case.lower().package())]
    fail_with(wrong)


@pytest.mark.P4
def test_identical_immutable_tensors_are_stored_once(ptn_case: Case) -> None:
    _stored_once(ptn_case)


@pytest.mark.P4
def test_a_deep_model_is_stored_once(ptn_backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> None:
    """P4 at a real model's sizes, past the catalogue's small tensors: a decoder's skeleton of ``LAYERS``
    layers whose four norms each start at one, as a checkpoint's do, read by two methods (256 bindings of
    one tensor: stored once, its alias map some 27 KB in the reference package), beside a token embedding
    of 2.5 MiB whose byte count is no multiple of a KiB. Read back, every binding holds its constant."""
    if Capability.PACKAGE not in ptn_backend.capabilities:
        skip_not_applicable(f"backend {ptn_backend.name} has no package capability (P4)")
    scenario, _ = _deep_model().scenario()
    _stored_once(Case(ptn_backend, scenario, lambda name: tmp_path_factory.mktemp(name)))


LAYERS = 32
NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)
VOCABULARY, WIDTH = 1301, 509
"""The embedding's shape: 1301 x 509 float32 is 2,648,836 bytes."""


class _Weight(nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)


class _Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = _Weight(
            torch.randn(VOCABULARY, WIDTH, generator=torch.Generator().manual_seed(67))
        )
        self.layers = nn.ModuleList(
            nn.ModuleDict({norm: _Weight(torch.ones(WIDTH)) for norm in NORMS}) for _ in range(LAYERS)
        )

    def normed(self, h: torch.Tensor) -> torch.Tensor:
        """``h`` times every norm's weight (in one product: the test is of how they are stored, and a
        multiplication each would make exporting the program take seconds)."""
        return h * torch.stack([layer[norm].weight for layer in self.layers for norm in NORMS]).prod(0)


class _DeepModel(nn.Module):
    """``model.embed_tokens.weight``, ``model.layers.<i>.<norm>.weight``: a Hugging Face decoder's paths."""

    def __init__(self) -> None:
        super().__init__()
        self.model = _Decoder()

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.normed(self.model.embed_tokens.weight.sum(0) * x)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.normed(self.model.embed_tokens.weight[-1] + x)


def _deep_model() -> NamedProgram:
    x = torch.linspace(-1, 1, WIDTH)
    return NamedProgram("deep_model", _DeepModel(), {"prefill": (x,), "decode": (x,)})


def _stored_once(case: Case) -> None:
    view = case.lower().package()
    programs = case.exported()
    wrong = [str(f) for f in dedupe_findings(view, programs)]
    fail_with(wrong)
    for method, ep in programs.items():
        for key, use in constants_of(ep).items():
            final = view.bindings[method].get(key)
            assert final is not None, f"method {method!r}: key {key!r} has no binding in the package"
            if not final.startswith("state/"):
                assert view.read(final).equal(use.tensor), (
                    f"{final!r} does not hold method {method!r} key {key!r}"
                )


@pytest.mark.P5
def test_state_is_never_an_alias(ptn_case: Case) -> None:
    wrong = [str(f) for f in state_alias_findings(ptn_case.lower().package())]
    fail_with(wrong)


@pytest.mark.P9
def test_lowering_twice_gives_identical_packages(ptn_case: Case) -> None:
    lowered = ptn_case.lower()
    first = lowered.path.read_bytes()
    # A package that embeds the time must show it, whatever the timing of the run: zip stamps members in
    # 2-second steps, so the second lowering starts in a later step than the one the first package ended in.
    written = lowered.path.stat().st_mtime
    next_step = (math.floor(written / ZIP_TIME_STEP) + 1) * ZIP_TIME_STEP
    time.sleep(max(0.0, next_step - time.time() + 0.01))
    second = ptn_case.lower_fresh().path.read_bytes()
    assert first == second, f"two lowerings differ ({len(first)} vs {len(second)} bytes)"
