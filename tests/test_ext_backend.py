"""``ext:<flow>``: ExecuTorch's backend test-suite flows as backends, wired from their testers' own stages.

The first test that reads the registry pays for importing it (about 10 s: it imports every toolchain that is
installed; naming an ``ext:`` backend reads it, to know if its flow quantizes); the wiring tests need none.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_ptn import expectations, upstream_noise
from pytest_ptn.backend import BackendNotFound, resolve_backend
from pytest_ptn.backends import ext, probe_cache
from pytest_ptn.harness import Case
from pytest_ptn.programs.catalogue import BY_NAME

QUIET = ("-p", "no:cacheprovider", "-q")
SUITE = str(Path(__file__).parents[1] / "conformance")
"""This checkout's suite (an installed one may be another version's)."""


@pytest.fixture(scope="module")
def registry_imported() -> None:
    """The flow registry and the quantizer ops its flows run, imported before an in-process run (and its
    pytester's snapshot of the modules, hence module scope): such a run drops what it imported, and these
    register themselves once per process (openvino's bindings, torch's quantized_decomposed library), so a
    later test could not import them again ("type 'Extension' is already registered")."""
    pytest.importorskip("executorch")
    with upstream_noise.contained():
        ext.registry()
        import torch.ao.quantization.fx._decomposed  # noqa: F401


def test_an_ext_name_is_a_flow_not_a_module_class_path() -> None:
    cls = resolve_backend("ext:xnnpack")  # "ext" and "xnnpack" are identifiers: a module:Class look-alike
    assert cls.name == "ext:xnnpack"
    assert resolve_backend("ext:xnnpack") is cls, "a run and its workers must agree on one class"
    with pytest.raises(BackendNotFound, match="a flow name is an identifier"):
        resolve_backend("ext:not a flow")


@pytest.fixture
def executorch() -> None:
    pytest.importorskip("executorch")


def arm_like_flow() -> Any:
    """A flow whose tester builds its partitioner in its own method, as Arm's does: the stage class it
    registers has no partitioner, so wiring from ``stage_classes`` would lower it as portable."""
    with upstream_noise.contained():  # executorch warns as it imports
        from executorch.backends.test.harness import Tester
        from executorch.backends.test.harness.stages import StageType, ToEdgeTransformAndLower
        from executorch.backends.test.suite.flow import TestFlow
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    class Lower(ToEdgeTransformAndLower):
        """Arm's stage: no default partitioner class, the given partitioners kept."""

        def __init__(self, partitioners: list[Any] | None = None) -> None:
            super().__init__()
            self.partitioners = partitioners or []

    class BuildsItsPartitioner(Tester):
        def __init__(self, module: Any, inputs: Any) -> None:
            classes = Tester.default_stage_classes() | {
                StageType.TO_EDGE_TRANSFORM_AND_LOWER: ToEdgeTransformAndLower
            }
            super().__init__(module, inputs, stage_classes=classes)

        def to_edge_transform_and_lower(self, stage: Any = None, generate_etrecord: bool = False) -> Any:
            return super().to_edge_transform_and_lower(
                stage or Lower([XnnpackPartitioner()]), generate_etrecord
            )

    return TestFlow("arm_like", backend="xnnpack", tester_factory=BuildsItsPartitioner)


@pytest.mark.usefixtures("executorch")
def test_the_wiring_is_what_the_testers_own_methods_pass_to_their_stages() -> None:
    import torch

    flow = arm_like_flow()
    with upstream_noise.contained():
        tester = flow.tester_factory(torch.nn.Identity(), (torch.zeros(1),))
        assert tester._get_default_stage(flow_stage_type()).partitioners == []  # the class default: portable
        wired = ext.wiring(flow, torch.nn.Identity(), (torch.zeros(1),))
    assert [type(p).__name__ for p in wired.partitioners] == ["XnnpackPartitioner"]
    assert ext.delegates_of(wired.partitioners) == {"XnnpackBackend"}
    assert wired.config is not None and wired.compile_config is not None


def flow_stage_type() -> Any:
    from executorch.backends.test.harness.stages import StageType

    return StageType.TO_EDGE_TRANSFORM_AND_LOWER


@pytest.mark.usefixtures("executorch")
def test_a_multi_method_program_lowers_through_a_flows_own_partitioner_and_runs(tmp_path: Path) -> None:
    flow = arm_like_flow()

    class ArmLike(ext.ExtFlowBackend):
        name = "ext:arm_like"
        flow_name = "arm_like"

        @classmethod
        def flow(cls) -> Any:
            return flow

    case = Case(ArmLike(), BY_NAME["shared_weight"], lambda name: tmp_path)
    assert not case.run_sequence(case.load())
    assert b"XnnpackBackend" in case.lower().path.read_bytes(), "each method was delegated as the tester says"


@pytest.mark.usefixtures("executorch")
def test_availability_says_why_a_flow_cannot_run_here() -> None:
    found = ext.registry()
    assert "portable" in found.flows and "xnnpack" in found.flows
    portable = resolve_backend("ext:portable").availability()
    assert portable.available, portable.reason
    assert set(portable.versions) >= {"executorch", "torch"}
    coreml = resolve_backend("ext:coreml").availability()
    assert not coreml.available
    assert "but this runtime has no CoreMLBackend" in coreml.reason or "Core ML" in coreml.reason
    assert "no flow 'no_such_flow'" in resolve_backend("ext:no_such_flow").availability().reason
    if "QNN" in found.skipped:  # QNN_SDK_ROOT unset, as on every machine without the SDK
        reason = resolve_backend("ext:qnn").availability().reason
        assert reason.startswith("flow 'qnn' is not registered") and "QNN_SDK_ROOT" in reason


class Unloadable(ext.ExtFlowBackend):
    """A flow that lowers to a delegate no runtime here has: whether it lowers is tried, and counted."""

    name = "ext:unloadable"
    flow_name = "unloadable"
    found_delegates = frozenset({"NoSuchBackend"})
    tried = 0

    @classmethod
    def lowering_fails(cls) -> str | None:
        cls.tried += 1
        return None


@pytest.mark.usefixtures("executorch")
def test_whether_a_flow_lowers_is_tried_once_per_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: every process that asked (each ``list backends``, each test process) lowered every such flow
    again, 2.5 minutes for the nine flows a pip install of executorch and tosa-tools registers."""
    flow = SimpleNamespace(name="unloadable", backend="unloadable", supports_serialize=True, quantize=False)
    monkeypatch.setattr(ext, "registry", lambda: ext.Registry({"unloadable": flow}, {}))
    monkeypatch.setattr(ext, "runtime_delegates", lambda: frozenset({"XnnpackBackend"}))
    monkeypatch.setenv(probe_cache.CACHE_ENV, str(tmp_path / "probes"))
    monkeypatch.setattr(Unloadable, "tried", 0)
    first = Unloadable.availability()
    assert not first.available
    assert first.reason == (
        "flow 'unloadable' lowers and writes a .pte here, but this runtime has no NoSuchBackend to load it "
        "(it has: XnnpackBackend)"
    )
    assert Unloadable.availability() == first
    assert Unloadable.tried == 1
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    assert Unloadable.availability() == first
    assert Unloadable.tried == 2, "another PATH may hold the toolchain the flow looks for"


NOISY = """
import ctypes, os
from pytest_ptn.backends import ext

class Noisy(ext.ExtFlowBackend):
    name = "ext:noisy"
    flow_name = "noisy"

    def lower(self, programs, workdir):  # as Vela prints its command stream, from native code, then fails
        print("from Python")
        os.write(1, b"straight to file descriptor 1\\n")
        ctypes.CDLL(None).printf(b"held in C's buffer\\n")
        raise RuntimeError("Unable to locate a model converter executable")

found = Noisy.lowering_fails()
ctypes.CDLL(None).fflush(None)  # what C still held would come out now
print("FOUND", found)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="printf from the C library of the process")
def test_what_a_flow_prints_while_it_is_tried_reaches_no_stdout() -> None:
    """``list backends --json`` writes to the same stdout: Vela's 180 lines made it unreadable JSON. In a
    fresh process, C's stdout buffered as it is without PYTHONUNBUFFERED."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    ran = subprocess.run([sys.executable, "-c", NOISY], capture_output=True, text=True, env=env, check=True)
    assert ran.stdout == "FOUND RuntimeError: Unable to locate a model converter executable\n"


@pytest.mark.usefixtures("executorch", "registry_imported")
def test_a_run_on_a_flow_checks_its_programs_and_refuses_one_that_cannot_load(
    pytester: pytest.Pytester,
) -> None:
    result = pytester.runpytest_inprocess(
        SUITE,
        *QUIET,
        "--ptn-backend=ext:portable",
        "-m",
        "E1",
        "-k",
        "shared_weight and up_front and not in_bf16 and not in_fp16",
    )
    result.assert_outcomes(passed=2)  # shared_weight, large_shared_weight
    refused = pytester.runpytest_inprocess(*QUIET, "--ptn-backend=ext:coreml", "-m", "E1")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*--ptn-backend=ext:coreml is unavailable on this machine: *CoreML*"])


@pytest.mark.parametrize(("flow", "pte_backend"), [("portable", "pte"), ("xnnpack", "pte-xnnpack")])
def test_a_flow_is_known_to_fail_exactly_as_the_pte_backend_it_matches(flow: str, pte_backend: str) -> None:
    """Both files are strict, and CI runs both backends: together they hold the flow to pte's verdicts."""
    folder = Path(SUITE) / "expectations"
    ext_file = expectations.read(folder / expectations.file_name(f"ext:{flow}"))
    pte_file = expectations.read(folder / expectations.file_name(pte_backend))
    assert ext_file.backend == f"ext:{flow}"
    assert ext_file.requires == pte_file.requires
    assert [(e.rule, e.scenario, e.reason) for e in ext_file.entries] == [
        (e.rule, e.scenario, e.reason) for e in pte_file.entries
    ]


@pytest.mark.usefixtures("executorch", "registry_imported")
def test_a_quantized_method_reading_another_methods_frozen_param_is_caught(pytester: pytest.Pytester) -> None:
    """The flow quantizes each method on its own, so both methods of quantized_linears hold a `_frozen_param0`
    with other bytes; a backend that gives decode prefill's fails E1, and the failure says whose it read."""
    result = pytester.runpytest_inprocess(
        SUITE,
        *QUIET,
        "--ptn-backend=broken_quantized:ReadsAnotherMethodsFrozenParam",
        "-m",
        "E1",
        "-k",
        "quantized_linears and up_front",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*call #1 decode(): *it read method 'prefill''s '_frozen_param0'*"])
