"""Programs as exporters hand them (optimum-executorch's shapes, in plain torch): keyword-only methods,
example inputs computed with autograd on, constant methods, a sequence length declared from 0. Each goes
through check_program and the suite's NamedProgram as it is; a call the method cannot take stays a
ProgramFormError."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_ptn.backends.reference import ReferenceBackend
from pytest_ptn.check import check_program
from pytest_ptn.harness import Case
from pytest_ptn.programs.source import ProgramFormError
from pytest_ptn.programs.user import NamedProgram, NamedProgramError, UserScenario

MAX_SEQ = 8


class KeywordDecoder(torch.nn.Module):
    """As optimum-executorch's decoder: keyword inputs only, a KV cache written at ``cache_position``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.register_buffer("cache", torch.zeros(MAX_SEQ, 4), persistent=False)

    def forward(self, *, tokens: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(0, cache_position, self.proj(tokens))
        return self.cache.sum(0) + tokens.sum(0)


class Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


def keyword_program(tokens: torch.Tensor) -> torch.export.ExportedProgram:
    """Exported as optimum exports: strict, keywords only, a sequence length declared 0..MAX_SEQ-1."""
    seq = torch.export.Dim("seq", min=0, max=MAX_SEQ - 1)
    torch.manual_seed(0)
    with torch.no_grad():
        return torch.export.export(
            KeywordDecoder(),
            (),
            {"tokens": tokens, "cache_position": torch.arange(tokens.shape[0])},
            dynamic_shapes={"tokens": {0: seq}, "cache_position": {0: seq}},
            strict=True,
        )


def step(start: int, length: int) -> dict[str, torch.Tensor]:
    return {"tokens": torch.randn(length, 4), "cache_position": torch.arange(start, start + length)}


@pytest.fixture(scope="module")
def keyword_ep() -> torch.export.ExportedProgram:
    return keyword_program(torch.ones(3, 4))


def test_a_keyword_only_program_with_constant_methods_is_checked_as_exported(
    keyword_ep: torch.export.ExportedProgram,
) -> None:
    """Its example inputs as export kept them, calls given as keywords (a prefill, then decodes of one
    token), constant methods in the program and in the calls: no exception, no finding, and the calls
    numbered as given."""
    program = {"forward": keyword_ep, "get_max_seq_len": MAX_SEQ, "use_kv_cache": True}
    calls = [
        ("get_max_seq_len", ()),
        ("forward", step(0, 3)),
        ("forward", step(3, 1)),
        ("forward", step(4, 1)),
    ]
    findings = check_program(program, {"forward": keyword_ep.example_inputs}, calls, backend="reference")
    assert findings == []
    assert findings.hazards.constant_methods == ("get_max_seq_len", "use_kv_cache")


def test_calls_are_numbered_as_given_around_constant_methods(
    keyword_ep: torch.export.ExportedProgram,
) -> None:
    from broken_backends import StateCopiedPerMethod

    program = {"forward": keyword_ep, "get_max_seq_len": MAX_SEQ}
    calls = [
        ("get_max_seq_len", ()),
        ("forward", step(0, 3)),
        ("get_max_seq_len", ()),
        ("forward", step(3, 1)),
    ]
    findings = check_program(program, {"forward": keyword_ep.example_inputs}, calls, StateCopiedPerMethod())
    assert findings and {f.call for f in findings if f.call is not None} <= {1, 3}, findings


def test_example_inputs_with_autograd_history_are_copied_detached() -> None:
    """optimum's decoder example inputs are an encoder's output computed with grad on: deep-copying the
    program, or a call's inputs, must not raise."""
    ep = keyword_program(torch.ones(3, 4))
    with_history = torch.ones(3, 4, requires_grad=True) * 2
    ep.example_inputs = ((), {"tokens": with_history, "cache_position": torch.arange(3)})
    assert ep.example_inputs[1]["tokens"].grad_fn is not None
    tokens = torch.ones(2, 4, requires_grad=True) * 3
    calls = [("forward", {"tokens": tokens, "cache_position": torch.arange(2)})]
    assert check_program({"forward": ep}, {"forward": ep.example_inputs}, calls) == []


def test_a_size_declared_from_zero_admits_one() -> None:
    """A positional method exported at length 3 with a length declared 0..7: the reference loader admits
    length 1 (torch's shape environment says 2.., its 0/1 specialization hint)."""
    length = torch.export.Dim("length", min=0, max=MAX_SEQ - 1)
    ep = torch.export.export(Scale(), (torch.ones(3),), dynamic_shapes=({0: length},))
    calls = [("forward", (torch.ones(3),)), ("forward", (torch.ones(1),))]
    assert check_program({"forward": ep}, {"forward": (torch.ones(3),)}, calls) == []


@pytest.mark.parametrize(
    ("given", "refused"),
    [
        ({"tokens": torch.ones(MAX_SEQ + 1, 4), "cache_position": torch.arange(MAX_SEQ + 1)}, "0..7"),
        ({"tokens": torch.ones(1, 4)}, r"keywords \['tokens', 'cache_position'\]"),
        ({"tokens": torch.ones(1, 4), "position": torch.tensor([0])}, "not 0 positional and keywords"),
    ],
)
def test_a_call_the_method_cannot_take_is_a_form_error(
    given: dict[str, torch.Tensor], refused: str, keyword_ep: torch.export.ExportedProgram
) -> None:
    with pytest.raises(ProgramFormError, match=refused):
        check_program({"forward": keyword_ep}, {"forward": keyword_ep.example_inputs}, [("forward", given)])


def test_a_refused_call_is_numbered_as_given(keyword_ep: torch.export.ExportedProgram) -> None:
    program = {"forward": keyword_ep, "get_max_seq_len": MAX_SEQ}
    too_long = step(0, MAX_SEQ + 1)
    with pytest.raises(ProgramFormError, match="^call #1 cannot be made"):
        check_program(
            program, {"forward": keyword_ep.example_inputs}, [("get_max_seq_len", ()), ("forward", too_long)]
        )


def test_a_constant_method_takes_no_inputs(keyword_ep: torch.export.ExportedProgram) -> None:
    inputs = {"forward": keyword_ep.example_inputs, "get_max_seq_len": (torch.ones(1),)}
    with pytest.raises(ProgramFormError, match="constant method 'get_max_seq_len' takes no inputs"):
        check_program({"forward": keyword_ep, "get_max_seq_len": MAX_SEQ}, inputs)


def test_a_keyword_program_is_a_suite_scenario(
    keyword_ep: torch.export.ExportedProgram, tmp_path: Path
) -> None:
    """The backend gets each call flat, in the program's keyword order whatever order the call gave."""
    program = NamedProgram(
        "keywords",
        {"forward": keyword_ep, "get_max_seq_len": MAX_SEQ},
        {"forward": keyword_ep.example_inputs},
        calls=[("forward", step(0, 3)), ("forward", dict(reversed(step(3, 1).items())))],
    )
    assert program.method_names == ("forward",) and program.constant_methods == ("get_max_seq_len",)
    scenario, _ = program.scenario()
    eager = program.eager()
    assert [tuple(t.shape) for t in eager[1].inputs] == [(1, 4), (1,)]
    case = Case(ReferenceBackend(), UserScenario("keywords", "", program, scenario.tags), lambda _: tmp_path)
    assert case.run_sequence(case.load()) == []


def test_a_suite_program_does_not_call_a_constant_method(keyword_ep: torch.export.ExportedProgram) -> None:
    with pytest.raises(NamedProgramError, match="a call to 'get_max_seq_len', a constant method"):
        NamedProgram(
            "calls_constant",
            {"forward": keyword_ep, "get_max_seq_len": MAX_SEQ},
            {"forward": keyword_ep.example_inputs},
            calls=[("get_max_seq_len", ())],
        )


def test_copying_an_exported_program_warns_nothing_from_our_code(
    keyword_ep: torch.export.ExportedProgram,
) -> None:
    """A deep copy of an ExportedProgram copies its pytree specs, which makes torch warn (FutureWarning about
    LeafSpec) from our code; a host with ``filterwarnings = error`` would fail a valid program."""
    import warnings

    from pytest_ptn.programs.source import UserProgram

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        UserProgram({"forward": keyword_ep}, {"forward": keyword_ep.example_inputs}).export()
