"""``--ptn-backend=ext:FLOW``: any TestFlow of ExecuTorch's own backend test suite as a backend.

ExecuTorch's suite (``executorch.backends.test.suite.flow.all_flows()``) keeps a registry of every backend and
recipe, each a tester factory whose stages hold the partitioners, edge compile config, passes and
ToExecutorch config. That suite is single-method; here a flow lowers a multi-method program: its tester is
built for each method and driven through its own ``to_edge_transform_and_lower`` and ``to_executorch``
methods with the stage run intercepted, so what the tester really passes to each stage (a partitioner Arm's
tester builds in a method, not a class default) is what lowers all methods at once. The result is a .pte
loaded with ``executorch.runtime``, exactly as the ``pte`` backends load theirs.

A flow with a quantize stage (``xnnpack_dynamic_int8_per_channel``) quantizes each method on its own with that
stage, before export (Capability.QUANTIZE, ``quantize``): the suite then checks it against the converted
per-method modules, within ``QUANTIZED``, on the quantization-friendly scenarios only.

Importing the registry takes seconds and pulls in other toolchains (coremltools, the vulkan and webgpu
testers): it happens only when an ``ext:`` backend is asked for, never when the plugin loads.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pytest_ptn import upstream_noise
from pytest_ptn.backend import (
    EXT_PREFIX,
    Availability,
    Backend,
    Capability,
    Loaded,
    Lowered,
    one_line,
    package_version,
)
from pytest_ptn.backends import probe_cache, tosa_reference
from pytest_ptn.backends.pte import PteLoaded, PteLowered, executorch_program, lower_to_pte
from pytest_ptn.instruments.comparison import Tolerance

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

REGISTRY_LOGGER = "executorch.backends.test.suite.flow"
SKIPPED = re.compile(r"Skipping (?P<group>.+?) flow registration: (?P<why>.*)", re.S)
"""What the registry logs for a group of flows it leaves out (its toolchain or SDK is missing)."""

TOOLCHAINS: dict[str, tuple[str, ...]] = {
    "openvino": ("openvino", "nncf"),
    "coreml": ("coremltools",),
    "arm": ("tosa-tools", "ethos-u-vela"),
}
"""Distributions, beyond executorch and torch, whose versions a flow's verdicts depend on, by the flow's
``backend``: reported with its availability, so expectation files can require them."""

PROVIDED_BY: dict[str, tuple[str, str]] = {
    "tosa_serializer": ("tosa-tools", "arm"),
    "tosa_reference_model": ("tosa-tools", "arm"),
    "tosa": ("tosa-tools", "arm"),
    "ethosu": ("ethos-u-vela", "arm"),
}
"""A module a group of flows imports -> (the distribution that provides it, this project's extra that
installs it): a reason that names a missing module names what to install."""
NO_MODULE = re.compile(r"No module named '(?P<module>[\w.]+)'")

PROBE = "a one-Linear program"
"""What a flow whose delegate this runtime lacks is lowered on, to say truly whether it lowers here."""

RUNTIME_ELSEWHERE: dict[str, str] = {
    "EthosUBackend": "an Ethos-U NPU to run on: the Corstone-300/320 FVP or a device",
    "VgfBackend": "a Vulkan ML runtime to run on: Arm's ML SDK emulation layer or a device",
}
"""Where a delegate no runtime here registers does run, for the reason of a flow that lowers to it."""


@dataclass(frozen=True)
class Registry:
    """The flows registered in this environment, and each group of flows left out with why."""

    flows: dict[str, Any]
    """flow name -> executorch.backends.test.suite.flow.TestFlow"""
    skipped: dict[str, str]
    """group (as the registry names it: "OpenVINO", "QNN") -> why it was not registered."""

    def why_not_registered(self, flow: str) -> str:
        """The reason a flow of this name is missing: its group's, else every group's."""
        key = _normalized(flow)
        mine = {g: why for g, why in self.skipped.items() if key.startswith(_normalized(g))}
        if mine:
            group, why = next(iter(mine.items()))
            return (
                f"flow {flow!r} is not registered: executorch's test suite skipped its {group} flows: {why}"
            )
        left_out = "".join(f"; {g} flows skipped: {why}" for g, why in sorted(self.skipped.items()))
        has = ", ".join(sorted(self.flows))
        return f"no flow {flow!r} in executorch's test-suite registry (it has {has}){left_out}"


@functools.cache
def registry() -> Registry:
    """``all_flows()``, once per process, with the reasons it logs for the groups it skips."""
    skipped: dict[str, str] = {}
    with upstream_noise.contained(), _no_root_handler_installed(), _records(REGISTRY_LOGGER) as records:
        from executorch.backends.test.suite.flow import all_flows

        flows = all_flows()
    for record in records:
        match = SKIPPED.match(record.getMessage())
        if match:
            skipped[match["group"]] = install_hint(" ".join(match["why"].split()))
    return Registry(dict(flows), skipped)


def install_hint(why: str) -> str:
    """``why``, and what to install, where it says a module that a known distribution provides is missing."""
    match = NO_MODULE.search(why)
    if match is None:
        return why
    provided = PROVIDED_BY.get(match["module"].partition(".")[0])
    if provided is None:
        return why
    dist, extra = provided
    return f"{why} (module of {dist}: pip install 'pytest-ptn[{extra}]')"


def distributions(flow: Any) -> tuple[str, ...]:
    """The distributions a flow's verdicts (and whether it lowers here) depend on."""
    return ("executorch", "torch", *TOOLCHAINS.get(flow.backend, ()))


@functools.cache
def runtime_delegates() -> frozenset[str]:
    """The delegates this executorch runtime registers (the pip wheel: XNNPACK, OpenVINO, QNN)."""
    with upstream_noise.contained():
        from executorch.extension.pybindings import portable_lib

        return frozenset(portable_lib._get_registered_backend_names())


@dataclass
class Wiring:
    """What a flow's tester passes to ``to_edge_transform_and_lower`` and ``to_executorch``."""

    partitioners: list[Any]
    compile_config: Any
    transform_passes: Any
    constant_methods: dict[str, Any] | None
    config: Any
    """The ExecutorchBackendConfig: fresh for each lowering (a memory planning pass refuses reuse)."""


def wiring(flow: Any, module: Any, inputs: tuple[Any, ...]) -> Wiring:
    """Build the flow's tester for one method and read the stages its own methods create."""
    tester = flow.tester_factory(module, inputs)
    lower = _stage_of(tester, "to_edge_transform_and_lower")
    to_executorch = _stage_of(tester, "to_executorch")
    return Wiring(
        list(lower.partitioners),
        lower.edge_compile_conf,
        getattr(lower, "transform_passes", None),  # the base stage has neither; Arm's has both
        getattr(lower, "constant_methods", None),
        to_executorch.config,
    )


def exported_method(ep: ExportedProgram) -> torch.nn.Module:
    """An exported method as the module a tester is built with: ``ep.module()`` itself refuses the
    ``eval()`` every tester calls, so it is held outside the module tree."""
    import torch

    class ExportedMethod(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.__dict__["program"] = ep

        def forward(self, *args: Any) -> Any:
            return self.__dict__["program"].module()(*args)

    return ExportedMethod()


def _stage_of(tester: Any, step: str, *args: Any) -> Any:
    """The stage ``tester.<step>(*args)`` would run, built by the tester itself but not run: the tester hands
    every stage to ``_run_stage``, which is intercepted for the call."""
    built: list[Any] = []

    def keep(stage: Any, *args: Any, **kwargs: Any) -> Any:
        built.append(stage)
        return tester

    tester._run_stage = keep
    try:
        getattr(tester, step)(*args)
    finally:
        del tester._run_stage
    return built[0]


def delegates_of(partitioners: list[Any]) -> set[str]:
    """The runtime backends (``CoreMLBackend``) these partitioners delegate to, by their delegation specs; a
    partitioner without one that wraps another (WebGPU's wraps Vulkan's) delegates to what it wraps."""
    found: set[str] = set()
    for p in partitioners:
        spec = getattr(p, "delegation_spec", None)
        if spec is not None:
            found.add(spec.backend_id)
        else:
            found |= delegates_of([v for v in vars(p).values() if hasattr(v, "partition")])
    return found


class ExtFlowBackend(Backend):
    """One TestFlow of the registry; ``flow_backend(name)`` makes the class for a flow name."""

    flow_name: ClassVar[str]
    capabilities = frozenset({Capability.EXECUTE})
    found_delegates: ClassVar[frozenset[str]]

    @classmethod
    def flow(cls) -> Any:
        return registry().flows[cls.flow_name]

    @classmethod
    def delegates(cls) -> frozenset[str]:
        """The runtime backends the flow's partitioners delegate to, from its tester built for a one-op
        method; found once per class (one class per flow)."""
        if "found_delegates" not in cls.__dict__:
            import torch

            with upstream_noise.contained():
                wired = wiring(cls.flow(), torch.nn.Identity(), (torch.zeros(1),))
            cls.found_delegates = frozenset(delegates_of(wired.partitioners))
        return cls.found_delegates

    @classmethod
    def on_reference_model(cls) -> bool:
        """Whether this flow lowers to TOSABackend alone, which no runtime here registers: its methods then
        run on the TOSA reference model (pytest_ptn.backends.tosa_reference), not from a loaded .pte."""
        missing = cls.delegates() - runtime_delegates()
        return missing == {tosa_reference.DELEGATE}

    @classmethod
    def availability(cls) -> Availability:
        """Said before any test: the flow is not registered (its toolchain or SDK is missing), quantizes,
        runs on the TOSA reference model, cannot write a .pte, or lowers to a delegate this runtime lacks
        (which would fail every load: 0x20); for that last, whether it lowers at all is tried on a one-Linear
        program. Importing the registry is the price of asking: only an ``ext:`` backend ever pays it."""
        if importlib.util.find_spec("executorch") is None:
            return Availability(False, "executorch is not installed")
        found = registry()
        if cls.flow_name not in found.flows:
            return Availability(False, found.why_not_registered(cls.flow_name))
        flow = cls.flow()
        versions = {d: v for d in distributions(flow) if (v := package_version(d)) is not None}
        try:
            delegates = cls.delegates()
        except Exception as e:
            return Availability(
                False, f"building flow {flow.name!r}'s tester failed: {one_line(e)}", versions
            )
        try:
            registered = runtime_delegates()
        except Exception as e:  # its C++ extension does not load (built against another torch)
            return Availability(False, f"this executorch runtime cannot be loaded: {one_line(e)}", versions)
        missing = sorted(delegates - registered)
        notes = []
        if missing == [tosa_reference.DELEGATE]:
            why = tosa_reference.missing()
            if why:
                extra = PROVIDED_BY[tosa_reference.MODULE][1]
                why = f"flow {flow.name!r} lowers to TOSABackend, which no runtime here has, and {why}"
                return Availability(False, f"{why}: pip install 'pytest-ptn[{extra}]'", versions)
            notes.append(tosa_reference.RUNS)
        elif missing:
            return Availability(False, cls._tried(missing, registered), versions)
        elif not flow.supports_serialize:
            why = f"flow {flow.name!r} has supports_serialize=False: it cannot write a .pte to load"
            return Availability(False, why, versions)
        if Capability.QUANTIZE in cls.capabilities:
            notes.append(
                f"each method quantized by flow {flow.name!r}'s quantize stage, checked on the "
                f"quantization-friendly scenarios against its converted modules, within {cls.tolerance}"
            )
        return Availability(True, "; ".join(notes), versions)

    @classmethod
    def _tried(cls, missing: list[str], registered: frozenset[str]) -> str:
        """Why a flow whose delegates this runtime lacks cannot run, from lowering ``PROBE`` through it (kept
        until the installed versions or PATH change: pytest_ptn.backends.probe_cache): either lowering fails
        here (and how), or it lowers and writes a .pte no runtime here loads, and what would."""
        flow, has = cls.flow(), ", ".join(sorted(registered)) or "none"
        depends_on = {"probe": f"lowering {PROBE}", **probe_cache.environment(distributions(flow))}
        failed = probe_cache.remembered(
            f"lowers-{cls.name.replace(':', '-')}", depends_on, cls.lowering_fails
        )
        if failed:
            return f"flow {flow.name!r} does not lower here (tried on {PROBE}): {failed}"
        needs = "; ".join(f"{d} needs {RUNTIME_ELSEWHERE[d]}" for d in missing if d in RUNTIME_ELSEWHERE)
        return (
            f"flow {flow.name!r} lowers and writes a .pte here, but this runtime has no {', '.join(missing)} "
            f"to load it (it has: {has})" + (f"; {needs}" if needs else "")
        )

    @classmethod
    def lowering_fails(cls) -> str | None:
        """What lowering ``PROBE`` through the flow raises here (quantized first by the flow, if it
        quantizes), as one line; None where it lowers and writes its .pte. What the flow prints meanwhile,
        through Python or from native code, is dropped."""
        import torch

        backend = cls()
        torch.manual_seed(0)
        module: torch.nn.Module = torch.nn.Linear(4, 4).eval()
        inputs = (torch.randn(1, 4),)
        try:
            with upstream_noise.contained(), tempfile.TemporaryDirectory() as tmp, _printing_dropped():
                if Capability.QUANTIZE in backend.capabilities:
                    module = backend.quantize(module, inputs)
                backend.lower({"forward": torch.export.export(module, inputs)}, Path(tmp))
        except Exception as e:
            return one_line(e)
        return None

    def keeps_no_state(self) -> str | None:
        return tosa_reference.STATEFUL if self.on_reference_model() else None

    def quantize(self, method: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.nn.Module:
        """The flow's own quantize stage, as its runner builds it (the flow's stage factory, else the tester's
        default), run on one method: PT2E prepare, calibration with ``inputs``, convert."""
        flow = self.flow()
        with upstream_noise.contained():
            tester = flow.tester_factory(method, inputs)
            given = flow.quantize_stage_factory() if flow.quantize_stage_factory else None
            stage = _stage_of(tester, "quantize", given)
            stage.run(method, inputs)
            converted: torch.nn.Module = stage.artifact
        return converted

    def lower(self, programs: dict[str, ExportedProgram], workdir: Path) -> Lowered:
        flow = self.flow()
        with upstream_noise.contained():
            wired = {
                m: wiring(flow, exported_method(ep), tuple(ep.example_inputs[0]))
                for m, ep in programs.items()
            }
        first = next(iter(wired.values()))
        lowering: dict[str, Any] = {
            "partitioners": {m: w.partitioners for m, w in wired.items()},
            "config": first.config,
            "transform_passes": first.transform_passes,
            "compile_config": first.compile_config,
            "constant_methods": first.constant_methods,
        }
        if not self.on_reference_model():
            return lower_to_pte(programs, workdir, **lowering)
        program = executorch_program(programs, **lowering)
        written = tosa_reference.written(program)
        if written:
            raise NotImplementedError(f"{tosa_reference.STATEFUL} (written: {', '.join(written)})")
        path = workdir / "program.pte"
        path.write_bytes(program.buffer)
        return tosa_reference.ReferenceModelLowered(path, program, list(programs))

    def load(self, lowered: Lowered) -> Loaded:
        if isinstance(lowered, tosa_reference.ReferenceModelLowered):
            return tosa_reference.ReferenceModelLoaded(lowered)
        assert isinstance(lowered, PteLowered)
        return PteLoaded(lowered)


def listing() -> list[tuple[str, type[ExtFlowBackend] | None, str]]:
    """What ``list backends`` shows of the registry: (name, class, why not registered) for every registered
    flow (class set, reason empty), then one row per group of flows the registry skipped (class None)."""
    if importlib.util.find_spec("executorch") is None:
        return [(f"{EXT_PREFIX}*", None, "executorch is not installed")]
    found = registry()
    rows: list[tuple[str, type[ExtFlowBackend] | None, str]] = [
        (f"{EXT_PREFIX}{name}", flow_backend(name), "") for name in sorted(found.flows)
    ]
    for group, why in sorted(found.skipped.items()):
        name = re.sub(r"[^a-z0-9]+", "_", group.lower())
        rows.append((f"{EXT_PREFIX}{name}*", None, f"{group} flows not registered: {why}"))
    return rows


QUANTIZED = Tolerance(
    atol=0.1,
    rtol=0.04,
    derivation=(
        "int8 has 255 steps over an activation's range, and a kernel that quantizes activations itself may "
        "land a step (range/255, about 0.02 for unit-scale rows of 8) from the converted module on some "
        "elements; each such step moves an output by the step times a unit-scale weight, a few of them up "
        "to atol 0.1, many up to 10 steps of 255 of the output's own magnitude, rtol 0.04; ExecuTorch's "
        "runner holds its flows to the same bounds against the same quantized reference"
    ),
)
"""What a flow that quantizes may differ by from its converted per-method modules (see ``derivation``). A
method reading another method's weights moves its outputs by the size of the outputs themselves."""


@functools.cache
def flow_backend(flow: str) -> type[ExtFlowBackend]:
    """The backend class of ``ext:<flow>``: one per flow name, so a run and its workers agree on it. A flow
    with a quantize stage quantizes each method (Capability.QUANTIZE), within ``QUANTIZED``; knowing which
    reads the registry, which an ``ext:`` backend's availability reads anyway."""
    attrs: dict[str, Any] = {
        "name": f"{EXT_PREFIX}{flow}",
        "flow_name": flow,
        "__module__": __name__,
        "__doc__": ExtFlowBackend.__doc__,
    }
    found = registry().flows.get(flow) if importlib.util.find_spec("executorch") is not None else None
    if found is not None and found.quantize:
        attrs |= {"capabilities": ExtFlowBackend.capabilities | {Capability.QUANTIZE}, "tolerance": QUANTIZED}
    return type(f"ExtFlowBackend_{flow}", (ExtFlowBackend,), attrs)


@contextmanager
def _printing_dropped() -> Iterator[None]:
    """Nothing printed inside reaches the caller's stdout (``list backends --json`` writes there): Arm's
    quantizer and Core ML's converter print their progress through Python, Vela its command stream from
    native code straight to file descriptor 1, through C's buffer (flushed before it is put back)."""
    sys.stdout.flush()
    kept = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull, redirect_stdout(devnull), redirect_stderr(devnull):
            os.dup2(devnull.fileno(), 1)
            try:
                yield
            finally:
                flush_c_stdio()
    finally:
        os.dup2(kept, 1)
        os.close(kept)


def flush_c_stdio() -> None:
    """What C's stdio buffers for stdout and stderr, written to their file descriptors now."""
    with contextlib.suppress(OSError, AttributeError):  # no C library by that name (Windows)
        ctypes.CDLL(None).fflush(None)


@contextmanager
def _no_root_handler_installed() -> Iterator[None]:
    """Importing the flows imports modules that call ``logging.basicConfig()`` (the XNNPACK partitioner):
    with the root logger still bare (pytest adds its handlers later), that would print every later warning
    of the host's run to stderr. A placeholder root handler makes it a no-op, and drops what is logged
    while importing (coremltools' notices about versions it was not tested with)."""
    root, placeholder = logging.getLogger(), logging.NullHandler()
    root.addHandler(placeholder)
    try:
        yield
    finally:
        root.removeHandler(placeholder)


@contextmanager
def _records(logger_name: str) -> Iterator[list[logging.LogRecord]]:
    """The records one logger emits while inside (at INFO and above, whatever its level was)."""
    logger = logging.getLogger(logger_name)
    handler = _Kept()
    records = handler.records
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False  # kept here: said once, in availability
    try:
        yield records
    finally:
        logger.propagate = propagate
        logger.removeHandler(handler)


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _normalized(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())
