"""A backend repository's own programs as conformance scenarios (the ``pytest_ptn_programs`` hook).

The example conftest of docs/check-program.md is the program under test, so the docs cannot rot. Runs
select that program (``-k``) and a few rules (``-m``) on the reference backend and its broken variants:
seconds, no executorch.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from separate_modules import Cache

from pytest_ptn.programs.build import Program
from pytest_ptn.programs.catalogue import BY_NAME
from pytest_ptn.programs.exported import functionalize
from pytest_ptn.programs.traits import derived_tags
from pytest_ptn.programs.user import NamedProgram, NamedProgramError

CHECK_PAGE = Path(__file__).parents[1] / "docs" / "check-program.md"
PROGRAM = "my_kv_model"


def docs_conftest() -> str:
    """The first python block of the docs' hook section."""
    text = CHECK_PAGE.read_text(encoding="utf-8")
    section = text[text.index("\n## Your programs in the conformance matrix\n") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "the docs' hook section has no python example"
    return match.group(1)


def run_suite(pytester: pytest.Pytester, backend: str, *args: str) -> pytest.RunResult:
    """The installed suite run from a folder holding the example conftest, as a backend repository runs it."""
    pytester.makeconftest(docs_conftest())
    return pytester.runpytest_inprocess(
        f"--ptn-backend={backend}", "-k", PROGRAM, "-p", "no:cacheprovider", "-v", *args
    )


def test_docs_program_runs_e_s_p_tests_on_reference(pytester: pytest.Pytester, warm_torch: None) -> None:
    result = run_suite(pytester, "reference", "-m", "E1 or E3 or E5 or S1 or S2 or S3 or P1 or P2")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) == 11 and "failed" not in outcomes, outcomes  # E1, E3, E5 twice
    result.stdout.fnmatch_lines(
        [
            f"*test_each_method_matches_eager?reference-{PROGRAM}-up_front? PASSED*",
            f"*test_shared_state_is_seen_by_every_method?reference-{PROGRAM}-up_front? PASSED*",
            f"*test_immutable_constants_live_in_their_method_namespace?reference-{PROGRAM}? PASSED*",
            f"*test_same_name_different_content_is_never_shared?reference-{PROGRAM}? PASSED*",
            "*S3  total collision           1p",
        ]
    )


@pytest.mark.parametrize(
    ("rule", "variant", "tests"), [("E3", "StateCopiedPerMethod", 2), ("S2", "MetadataOnly", 1)]
)
def test_broken_variant_fails_on_the_program(
    rule: str, variant: str, tests: int, pytester: pytest.Pytester, warm_torch: None
) -> None:
    """``tests``: E3 runs once per load schedule."""
    result = run_suite(pytester, f"broken_backends:{variant}", "-m", rule)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == tests and "passed" not in outcomes, outcomes
    result.stdout.fnmatch_lines([f"FAILED *{PROGRAM}*"])


def test_expectation_file_can_name_the_program(pytester: pytest.Pytester, warm_torch: None) -> None:
    known = pytester.path / "known.toml"
    known.write_text(
        f'backend = "broken-p1"\n[[xfail]]\nrule = "P1"\nscenario = "{PROGRAM}"\nreason = "r"\nlink = "l"\n'
    )
    result = run_suite(
        pytester, "broken_backends:NotNamespaced", "-m", "P1", f"--ptn-expectations={known}", "-rx"
    )
    assert result.parseoutcomes() == {"xfailed": 1, "deselected": result.parseoutcomes()["deselected"]}


def test_expectation_file_naming_no_program_is_an_error(pytester: pytest.Pytester) -> None:
    known = pytester.path / "known.toml"
    known.write_text(
        'backend = "reference"\n[[xfail]]\nrule = "P1"\nscenario = "my_kv_modle"\nreason = "r"\n'
    )
    known.write_text(known.read_text() + 'link = "l"\n')
    result = run_suite(pytester, "reference", f"--ptn-expectations={known}", "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown scenario 'my_kv_modle'*"])


def test_program_named_like_a_catalogue_scenario_is_an_error(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        docs_conftest().replace(f'"{PROGRAM}"', '"kv_cache"'),
    )
    result = pytester.runpytest_inprocess("--ptn-backend=reference", "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*pytest_ptn_programs: program name 'kv_cache' is taken*"])


@pytest.mark.parametrize("name", ["total_collision", "equal_bytes_state", "private_same_shape_buffers"])
def test_derived_tags_include_the_catalogues(name: str) -> None:
    scenario = BY_NAME[name]
    assert scenario.tags <= derived_tags(functionalize(Program(scenario.spec).export()))


class Scaled(torch.nn.Module):
    def __init__(self, value: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((4,), value))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def test_separately_built_modules_with_one_fqn_collide() -> None:
    x = torch.ones(4)
    program = NamedProgram(
        "two", {"classify": Scaled(1.0), "regress": Scaled(2.0)}, {"classify": (x,), "regress": (x,)}
    )
    scenario, _ = program.scenario()
    assert {"collision", "total_collision"} <= scenario.tags and "dedupe" not in scenario.tags
    assert [call.outputs[0].tolist() for call in program.eager()] == [[1.0] * 4, [2.0] * 4]


def test_exported_for_inference_whatever_the_grad_mode() -> None:
    """A trainable parameter written beside a buffer in place fails a lowering in grad mode (issue 15)."""
    program = NamedProgram("scaled", {"forward": Scaled(1.0)}, {"forward": (torch.ones(4),)})
    assert torch.is_grad_enabled()
    exported = program.export()["forward"]
    assert not any(t.requires_grad for t in exported.state_dict.values())


def test_other_values_keep_names_and_change_tensors() -> None:
    program = NamedProgram("scaled", {"forward": Scaled(1.0)}, {"forward": (torch.ones(4),)})
    other = program.with_other_values()
    assert list(other.export()["forward"].state_dict) == ["weight"]
    assert other.eager()[0].outputs[0].tolist() == [1.5] * 4


def test_a_program_runs_as_lowered_for_inference() -> None:
    """A model handed over in training mode runs eagerly in eval mode: dropout would make eager random."""
    model = torch.nn.Sequential(torch.nn.Dropout(0.5)).train()
    program = NamedProgram("dropped", {"forward": model}, {"forward": (torch.ones(64),)})
    assert program.eager()[0].outputs[0].equal(torch.ones(64))
    assert model.training  # the host's model is untouched


def test_separately_built_modules_share_a_same_named_buffer_one_method_writes() -> None:
    """One state per FQN in a program (E3, P2): decode's ``cache`` is the one prefill writes."""
    x = torch.ones(4)
    program = NamedProgram(
        "tied",
        {"prefill": Cache(0.0, writes=True), "decode": Cache(0.0, writes=False)},
        {"prefill": (x,), "decode": (x,)},
        calls=[("prefill", (x,)), ("decode", (x,))],
    )
    assert [call.outputs[0].tolist() for call in program.eager()] == [[2.0] * 4, [2.0] * 4]
    assert program.eager()[-1].state_after["cache"].tolist() == [1.0] * 4
    assert "shared_state" in program.scenario()[0].tags


def test_a_same_named_buffer_starting_from_other_values_is_refused() -> None:
    """A state conflict (P7) is a program the rules reject: it cannot be a valid-program scenario."""
    x = torch.ones(4)
    program = NamedProgram(
        "conflicting",
        {"prefill": Cache(0.0, writes=True), "decode": Cache(1.0, writes=False)},
        {"prefill": (x,), "decode": (x,)},
    )
    refusal = r"ptn program 'conflicting': mutable key 'cache' differs between methods 'prefill' and 'decode'"
    with pytest.raises(NamedProgramError, match=refusal + r".*\(P7\)"):
        program.scenario()
    with pytest.raises(NamedProgramError, match=refusal):
        program.eager()


CONFLICTING_CONFTEST = """
import torch

from pytest_ptn.programs.user import NamedProgram


class Cache(torch.nn.Module):
    def __init__(self, start):
        super().__init__()
        self.register_buffer("cache", torch.full((4,), start))

    def forward(self, x):
        self.cache.add_(x)
        return x + self.cache


def pytest_ptn_programs(config):
    x = torch.ones(4)
    model = {"prefill": Cache(0.0), "decode": Cache(1.0)}
    return [NamedProgram("conflicting", model, {"prefill": (x,), "decode": (x,)})]
"""


def test_a_run_given_a_conflicting_program_stops_naming_it(
    pytester: pytest.Pytester, warm_torch: None
) -> None:
    pytester.makeconftest(CONFLICTING_CONFTEST)
    result = pytester.runpytest_inprocess(
        "--ptn-backend=reference", "-p", "no:cacheprovider", "--collect-only"
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        ["*NamedProgramError: ptn program 'conflicting': mutable key 'cache' differs between methods*(P7)*"]
    )


RAISING_CONFTEST = """
import torch

from pytest_ptn.programs.user import NamedProgram


class Encoder(torch.nn.Module):
    def forward(self, x):
        return x + 1


class Decoder(torch.nn.Module):
    def forward(self, x):
        raise ValueError("the user's own bug")


def pytest_ptn_programs(config):
    x = torch.ones(4)
    model = {"encoder": Encoder(), "decoder": Decoder()}
    return [NamedProgram("raising", model, {"encoder": (x,), "decoder": (x,)})]
"""


def test_a_forward_that_raises_during_export_says_which_method(
    pytester: pytest.Pytester, warm_torch: None
) -> None:
    """Both methods' code is a ``forward``: the user's error comes through, naming the method exported."""
    pytester.makeconftest(RAISING_CONFTEST)
    result = pytester.runpytest_inprocess(
        "--ptn-backend=reference", "-p", "no:cacheprovider", "--collect-only"
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        [
            "*ValueError: the user's own bug*",
            "*raised while exporting method 'decoder' (torch.export.export)*",
        ]
    )


def test_exported_programs_are_a_program() -> None:
    """A mapping of method name -> ExportedProgram, eager truth from ``ep.module()`` of a fresh copy."""
    x = torch.ones(4)
    exported = {
        name: torch.export.export(Scaled(value), (x,), strict=False)
        for name, value in [("classify", 1.0), ("regress", 2.0)]
    }
    program = NamedProgram("exported", exported, {"classify": (x,), "regress": (x,)})
    scenario, _ = program.scenario()
    assert {"collision", "total_collision"} <= scenario.tags
    assert [call.outputs[0].tolist() for call in program.eager()] == [[1.0] * 4, [2.0] * 4]
    other = program.with_other_values()
    assert [call.outputs[0].tolist() for call in other.eager()] == [[1.5] * 4, [2.5] * 4]
    assert list(program.export()["classify"].state_dict) == ["weight"]
    assert exported["classify"].state_dict["weight"].tolist() == [1.0] * 4  # the host's programs untouched


def test_the_run_header_shows_each_programs_hazards(pytester: pytest.Pytester, warm_torch: None) -> None:
    """What the rules can bite on in the program: all four hazards, so no rule is left without a case."""
    pytester.makeconftest(docs_conftest())
    result = pytester.runpytest_inprocess(
        "--ptn-backend=reference", "-p", "no:cacheprovider", "--collect-only"
    )
    result.stdout.fnmatch_lines(
        [
            f"ptn program {PROGRAM}: methods prefill, decode",
            "  names minted in several methods with different bytes: 'lifted_tensor_0' (prefill, decode)",
            "  tensors shared by identity: prefill:proj.weight = decode:proj.weight; prefill:proj.bias = *",
            "  state shared across methods: 'cache' (prefill, decode; written by prefill)",
            "  methods loaded lazily, at their first call: decode after prefill ran",
        ]
    )
    assert "to check" not in result.stdout.str()
