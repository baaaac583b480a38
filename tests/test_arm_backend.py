"""Arm's flows (``ext:arm_*``, the ``[arm]`` extra; skipped without it): the TOSA flows run each method on the
TOSA reference model, and every Arm flow's reason says truly what it can and cannot do here.

The first test that reads the registry pays for importing it (about 10 s), each reason that is tried by
lowering a one-Linear program 1-3 s more (in an empty cache of what was tried, so it really is).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pytest_ptn import upstream_noise
from pytest_ptn.backend import resolve_backend
from pytest_ptn.backends import ext, probe_cache, tosa_reference
from pytest_ptn.ruleset import NOT_APPLICABLE_PREFIX

QUIET = ("-p", "no:cacheprovider", "-q")
SUITE = str(Path(__file__).parents[1] / "conformance")
"""This checkout's suite (an installed one may be another version's)."""


def test_a_missing_arm_module_is_named_with_what_installs_it() -> None:
    """What the registry logs for the Arm group without tosa-tools: the module alone said nothing of what to
    install."""
    found = ext.Registry({}, {"ARM": ext.install_hint("No module named 'tosa_serializer'")})
    reason = found.why_not_registered("arm_tosa_fp")
    assert reason.startswith("flow 'arm_tosa_fp' is not registered: executorch's test suite skipped its ARM")
    assert "module of tosa-tools: pip install 'pytest-ptn[arm]'" in reason
    assert ext.install_hint("No module named 'coremltools'") == "No module named 'coremltools'"


@pytest.fixture(scope="module")
def registry_imported() -> None:
    """The flow registry and the quantizer ops its flows run, imported before an in-process run (module
    scope, as tests/test_ext_backend.py says why)."""
    with upstream_noise.contained():
        ext.registry()
        import torch.ao.quantization.fx._decomposed  # noqa: F401


ARM_REASONS = {
    "arm_tosa_fp": (True, ["TOSA payload runs on the TOSA reference model", "is not applicable"]),
    "arm_tosa_int": (True, ["TOSA reference model", "quantized by flow 'arm_tosa_int''s quantize stage"]),
    "arm_ethos_u55": (False, ["lowers and writes a .pte here", "no EthosUBackend", "Corstone-300/320 FVP"]),
    "arm_ethos_u85": (False, ["lowers and writes a .pte here", "no EthosUBackend", "Corstone-300/320 FVP"]),
    "arm_vgf_fp": (False, ["does not lower here", "Unable to locate a model converter executable"]),
    "arm_vgf_int": (False, ["does not lower here", "Unable to locate a model converter executable"]),
}


@pytest.fixture(scope="module")
def nothing_tried_yet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """An empty cache of what was tried (pytest_ptn.backends.probe_cache): each flow here is lowered for
    real, not read back from an earlier run."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(probe_cache.CACHE_ENV, str(tmp_path_factory.mktemp("probes")))
        yield


@pytest.mark.extra("arm")
@pytest.mark.usefixtures("nothing_tried_yet")
@pytest.mark.parametrize("flow", sorted(ARM_REASONS))
def test_every_arm_flow_says_what_it_can_and_cannot_do_here(
    flow: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """Before: the TOSA flows said they cannot write a .pte (they can), the VGF flows that they lower (they do
    not: found by lowering, not by building a partitioner). Vela's command stream, printed from native code
    while the Ethos-U flows are tried, reaches no stdout."""
    available, words = ARM_REASONS[flow]
    got = resolve_backend(f"ext:{flow}").availability()
    assert got.available is available, got.reason
    for word in words:
        assert word in got.reason
    assert set(got.versions) >= {"executorch", "torch", "tosa-tools", "ethos-u-vela"}
    assert capfd.readouterr().out == ""


@pytest.mark.extra("arm")
def test_without_the_reference_model_a_tosa_flow_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tosa_reference, "missing", lambda: "the TOSA reference model is not installed")
    got = resolve_backend("ext:arm_tosa_fp").availability()
    assert not got.available
    assert got.reason == (
        "flow 'arm_tosa_fp' lowers to TOSABackend, which no runtime here has, and the TOSA reference model "
        "is not installed: pip install 'pytest-ptn[arm]'"
    )


class TwoHeads(torch.nn.Module):
    """Two methods, each owning ``lin.weight``, ``lin.bias`` and ``b`` with values of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = Head(0), Head(1)

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        return self.first(x)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(x)


class Head(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("b", torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.b


@pytest.mark.extra("arm")
def test_check_program_runs_a_two_method_program_on_the_reference_model() -> None:
    """Each method's names collide with the other's: on the reference model each reads its own, and a
    lowering that binds the later method's by name (broken_arm) is an E1 finding on that method."""
    from broken_arm import ReadsTheFirstMethodsConstants

    from pytest_ptn.check import check_program

    heads = {"prefill": Head(0), "decode": Head(1)}
    methods = {"prefill": (torch.randn(2, 4),), "decode": (torch.randn(2, 4),)}
    assert check_program(heads, methods, backend="ext:arm_tosa_fp") == []
    findings = check_program(heads, methods, backend=ReadsTheFirstMethodsConstants())
    wrong = [f for f in findings if f.rule == "E1"]
    assert [(f.method, f.call) for f in wrong] == [("decode", 1)], findings


@pytest.mark.extra("arm")
def test_each_method_alone_runs_on_the_reference_model_in_a_fresh_process(tmp_path: Path) -> None:
    """The truth isolation is judged by (pytest_ptn.check.alone): the flow's class is made at run time, so
    no module attribute names it for pickle, and a fresh process makes it again from the backend's name."""
    from pytest_ptn.check.alone import MethodsAlone
    from pytest_ptn.programs.exported import functionalize

    heads = TwoHeads()
    x = torch.randn(2, 4)
    alone = MethodsAlone(
        resolve_backend("ext:arm_tosa_fp")(),
        lambda: functionalize(
            {
                "prefill": torch.export.export(heads.first, (x,)),
                "decode": torch.export.export(heads.second, (x,)),
            }
        ),
        {},
        lambda name: tmp_path / name,
    )
    prefill, decode = alone.run([("prefill", (x,)), ("decode", (x,))])
    with torch.no_grad():
        torch.testing.assert_close(prefill.outputs[0], heads.prefill(x))
        torch.testing.assert_close(decode.outputs[0], heads.decode(x))


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(x)
        return self.count * 2


@pytest.mark.extra("arm")
def test_check_program_refuses_a_program_that_writes_state_on_the_reference_model() -> None:
    """Not an E2 finding (the lowering refuses it) nor a pass: the runner cannot hold state between calls."""
    from pytest_ptn.backend import BackendError
    from pytest_ptn.check import check_program

    with pytest.raises(BackendError, match="cannot check this program: it writes count, and the TOSA ref"):
        check_program(Counter(), {"forward": (torch.ones(4),)}, backend="ext:arm_tosa_fp")


@pytest.mark.extra("arm")
@pytest.mark.usefixtures("registry_imported")
@pytest.mark.parametrize(
    ("variant", "rule", "scenarios"),
    [
        ("ReadsTheFirstMethodsConstants", "E1", "shared_weight or colliding"),
        ("RejectsCollidingNames", "E2", "colliding"),
        ("InexactReferenceModel", "A1", "shared_weight and not in_bf16 and not in_fp16"),
    ],
)
def test_the_suite_catches_a_broken_runner_around_the_reference_model(
    variant: str, rule: str, scenarios: str, pytester: pytest.Pytester
) -> None:
    result = pytester.runpytest_inprocess(
        SUITE,
        *QUIET,
        f"--ptn-backend=broken_arm:{variant}",
        "-m",
        rule,
        "-k",
        scenarios,
        "--maxfail=1",
        "-rx",
    )
    outcomes = result.parseoutcomes()
    if rule == "A1":  # a SHOULD rule: its failure is an xfail of the run
        assert outcomes.get("xfailed", 0) > 0, outcomes
        result.stdout.fnmatch_lines([f"*SHOULD rule {rule} not met*"])
    else:
        assert outcomes.get("failed", 0) > 0, f"{variant} breaks {rule} but the suite passed: {outcomes}"


@pytest.mark.extra("arm")
@pytest.mark.usefixtures("registry_imported")
def test_state_carried_between_calls_is_not_applicable_never_passed(pytester: pytest.Pytester) -> None:
    """The reference model keeps nothing between calls: every test of a program with a written buffer is not
    applicable, with why, and none passes."""
    result = pytester.runpytest_inprocess(
        SUITE, *QUIET, "--ptn-backend=ext:arm_tosa_fp", "-m", "E1 or E3 or E4", "-k", "kv_cache", "-rs"
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped", 0) > 0 and "passed" not in outcomes and "failed" not in outcomes, outcomes
    result.stdout.fnmatch_lines([f"*{NOT_APPLICABLE_PREFIX}: ext:arm_tosa_fp on kv_cache, a program that*"])
    assert tosa_reference.STATEFUL in result.stdout.str().replace("\n", "")


@pytest.mark.extra("arm")
def test_list_backends_shows_each_arm_flow_in_one_line() -> None:
    """In a fresh process, as ``python -m pytest_ptn list backends`` runs: it asks the flows in forked
    workers, and a fork of this process, after the tests above ran torch's thread pool in it, hung there.
    The registry's Arm flows alone: asking every other flow cold took a minute."""
    script = """
import json
from pytest_ptn.backends import ext
from pytest_ptn.cli import inventory
arm = [flow for flow in ext.listing() if flow[0].startswith("ext:arm_")]
ext.listing = lambda: arm
infos = inventory.ext_flows()
print(json.dumps({"infos": [[b.name, b.available, b.reason] for b in infos],
                  "lines": inventory.render_backends(infos)}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout.splitlines()[-1])
    assert sorted(name.removeprefix("ext:") for name, _, _ in listed["infos"]) == sorted(ARM_REASONS)
    for name, available, reason in listed["infos"]:
        (line,) = [line for line in listed["lines"] if line.startswith(f"{name} ")]
        assert reason in line and ("yes" if available else "no") in line.split()
