"""The ``.pte`` backends: ExecuTorch's own lowering (``to_edge_transform_and_lower`` -> ``to_executorch``) and
runtime (``executorch.runtime``), in the four configurations multi-method programs use upstream.

None claims STORAGE: the runtime names a constant only when it is external or a mutable buffer
(``get_attribute``), so lifted constants (scalars, ``torch.tensor`` literals) have no identity to show.
None claims PACKAGE: the .pte keys in-file constants by content and the .ptd by FQN, with no method
namespace, so a PackageView could only report P1-P3 as failing by design. Heavy imports happen inside
methods: the plugin imports this module at start-up.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_ptn import upstream_noise
from pytest_ptn.backend import (
    Availability,
    Backend,
    Capability,
    Loaded,
    Lowered,
    Ownership,
    package_version,
)
from pytest_ptn.backends import pte_replay

if TYPE_CHECKING:
    import torch
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, ExecutorchProgramManager
    from executorch.runtime import Method, Program
    from torch.export import ExportedProgram

    from pytest_ptn.backend import EagerCall


@dataclass(frozen=True)
class MethodSignature:
    """What the .pte's flat I/O means: which outputs are user-input mutations, which buffers it holds."""

    input_mutations: dict[int, int]
    """output index -> user input index it writes back (the runtime returns mutated inputs as outputs)."""
    buffers: frozenset[str]
    """FQNs of the mutable buffers (mutated by any method) this method's plan holds."""


class PteLowered(Lowered):
    def __init__(
        self,
        path: Path,
        data_path: Path | None,
        methods: dict[str, MethodSignature],
        planned_together: dict[str, dict[str, set[str]]] | None = None,
        held: Ownership | None = None,
    ):
        """``planned_together``: the memory plan's word on state other methods' tensors also use
        (``shared_memory``); unknown (``{}``) for a .pte read back from disk alone. ``held``: which constants
        the backend under test holds (``ownership``); unknown for a .pte read back from disk alone."""
        self.path = path
        self.data_path = data_path
        self.methods = methods
        self.planned_together = planned_together or {}
        self.held = held

    def ownership(self) -> Ownership | None:
        return self.held

    def shared_memory(self) -> dict[str, dict[str, set[str]]]:
        return self.planned_together

    def files(self) -> dict[str, Path]:
        return {"path": self.path, **({"data_path": self.data_path} if self.data_path is not None else {})}

    def bundle_scripts(
        self, calls_file: str, files: dict[str, str], calls: Sequence[EagerCall]
    ) -> dict[str, str]:
        mutations = {name: m.input_mutations for name, m in self.methods.items()}
        return {pte_replay.SCRIPT: pte_replay.runtime_script(mutations, calls_file, files, calls)}


class PteLoaded(Loaded):
    """One ``Runtime.load_program`` of the .pte. Methods load on first use, as ``Program.load_method`` does:
    loading all of them up front would hide that a late load re-initializes shared buffers."""

    def __init__(self, lowered: PteLowered):
        self._lowered = lowered
        self._program = _load_program(lowered)
        self._loaded: dict[str, Method] = {}

    def _method(self, method: str) -> Method:
        if method not in self._loaded:
            if method not in self._lowered.methods:
                raise KeyError(
                    f"no method {method!r} in {self._lowered.path} (has {sorted(self._lowered.methods)})"
                )
            loaded = self._program.load_method(method)
            assert loaded is not None
            self._loaded[method] = loaded
        return self._loaded[method]

    def load_method(self, method: str) -> None:
        self._method(method)

    def run(self, method: str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        outputs = list(self._method(method).execute(list(inputs)))
        mutations = self._lowered.methods[method].input_mutations
        for out, index in mutations.items():
            inputs[index].copy_(outputs[out])
        return [t for i, t in enumerate(outputs) if i not in mutations]


class SharedStateLoaded(PteLoaded):
    """A program whose mutable buffers keep their FQN (``emit_mutable_buffer_names``), so they can be read."""

    def state(self) -> dict[str, torch.Tensor]:
        """Every mutable buffer, read through a loaded method holding it. Observing never loads a method of
        this copy (that would re-initialize what it reads); a buffer no loaded method holds yet is read from
        a throwaway copy of the program, which shows the value this copy will start it from."""
        holders = {m: s.buffers for m, s in self._lowered.methods.items()}
        out = {}
        fresh: SharedStateLoaded | None = None
        for fqn in sorted(set().union(*holders.values())):
            source: SharedStateLoaded = self
            method = next((m for m in self._loaded if fqn in holders[m]), None)
            if method is None:
                fresh = fresh or SharedStateLoaded(self._lowered)
                source, method = fresh, next(m for m in holders if fqn in holders[m])
            out[fqn] = source._method(method)._method.get_attribute(fqn).clone()
        return out


class PteBackend(Backend):
    """Portable kernels, constants inside the .pte: executorch's defaults."""

    name = "pte"
    capabilities = frozenset({Capability.EXECUTE})

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("executorch") is None:
            return Availability(False, "executorch is not installed")
        return Availability(True, versions={d: package_version(d) or "?" for d in ("executorch", "torch")})

    @classmethod
    def load_runtime(cls) -> None:
        """``executorch.runtime`` as ``_load_program`` imports it: its C++ extension links the torch it was
        built against. Importing it costs what a lowering pays anyway (``executorch.exir`` imports it)."""
        with upstream_noise.contained():
            from executorch.runtime import Runtime

            Runtime.get()

    def partitioners(self, method: str) -> list[Any]:
        """Partitioners for one method (a delegate may need the method's name in its compile specs)."""
        return []

    def transform_passes(self) -> list[Any]:
        return []

    def config(self) -> ExecutorchBackendConfig:
        from executorch.exir import ExecutorchBackendConfig

        return ExecutorchBackendConfig()

    def lower(self, programs: dict[str, ExportedProgram], workdir: Path) -> PteLowered:
        with upstream_noise.contained():  # importing a partitioner warns too
            return lower_to_pte(
                programs,
                workdir,
                partitioners={method: self.partitioners(method) for method in programs},
                transform_passes=self.transform_passes(),
                config=self.config(),
            )

    def load(self, lowered: Lowered) -> PteLoaded:
        assert isinstance(lowered, PteLowered)
        return PteLoaded(lowered)


class XnnpackBackend(PteBackend):
    """The XNNPACK delegate: its weights become named data keyed by the sha256 of their bytes."""

    name = "pte-xnnpack"

    def partitioners(self, method: str) -> list[Any]:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        return [XnnpackPartitioner()]


class ExternalConstantsBackend(PteBackend):
    """``external_constants=True``: parameters and buffers go to a .ptd by FQN; lifted constants stay."""

    name = "pte-external"

    def config(self) -> ExecutorchBackendConfig:
        from executorch.exir import ExecutorchBackendConfig

        return ExecutorchBackendConfig(external_constants=True)


class SharedStateBackend(PteBackend):
    """Mutable buffers with one FQN get one allocation across methods, named and starting from eager values:
    the upstream recipe for a KV cache shared by prefill and decode."""

    name = "pte-shared-state"
    capabilities = frozenset({Capability.EXECUTE, Capability.STATE})

    def transform_passes(self) -> list[Any]:
        from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

        # Patterns match placeholder names by substring and only affect mutable buffers: "" means all of them.
        return [InitializedMutableBufferPass([""])]

    def config(self) -> ExecutorchBackendConfig:
        from executorch.exir import ExecutorchBackendConfig
        from executorch.exir.passes import MemoryPlanningPass

        # A fresh planning pass per lowering: it keeps cross-method state and refuses to be reused.
        return ExecutorchBackendConfig(
            memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True),
            emit_mutable_buffer_names=True,
        )

    def load(self, lowered: Lowered) -> SharedStateLoaded:
        assert isinstance(lowered, PteLowered)
        return SharedStateLoaded(lowered)


def lower_to_pte(
    programs: dict[str, ExportedProgram],
    workdir: Path,
    *,
    partitioners: dict[str, list[Any]],
    config: ExecutorchBackendConfig,
    transform_passes: Any = None,
    compile_config: EdgeCompileConfig | None = None,
    constant_methods: dict[str, Any] | None = None,
) -> PteLowered:
    """``to_edge_transform_and_lower`` -> ``to_executorch`` of every method at once, written as a .pte (and
    its .ptd, if the config externalizes data) under ``workdir``: what every .pte backend lowers with."""
    et = executorch_program(
        programs,
        partitioners=partitioners,
        config=config,
        transform_passes=transform_passes,
        compile_config=compile_config,
        constant_methods=constant_methods,
    )
    path = workdir / "program.pte"
    with path.open("wb") as f:
        et.write_to_file(f)
    data_dir = workdir / "data"
    data_dir.mkdir(exist_ok=True)
    for stale in data_dir.glob("*.ptd"):  # an earlier lowering into the same folder
        stale.unlink()
    et.write_tensor_data_to_file(str(data_dir))
    data = sorted(data_dir.glob("*.ptd"))
    if len(data) > 1:  # Runtime.load_program takes one .ptd
        raise NotImplementedError(f"lowering wrote {len(data)} .ptd files, the runtime loads one: {data}")
    lowered = {m: et.exported_program(m) for m in programs}
    delegated = any(partitioners.values())
    return PteLowered(
        path,
        data[0] if data else None,
        _signatures(lowered),
        planned_together(lowered),
        ownership(lowered, delegated),
    )


def executorch_program(
    programs: dict[str, ExportedProgram],
    *,
    partitioners: dict[str, list[Any]],
    config: ExecutorchBackendConfig,
    transform_passes: Any = None,
    compile_config: EdgeCompileConfig | None = None,
    constant_methods: dict[str, Any] | None = None,
) -> ExecutorchProgramManager:
    """``to_edge_transform_and_lower`` -> ``to_executorch`` of every method at once, in memory: a runner that
    executes the lowered graphs itself (a delegate simulated in Python) reads them from here."""
    with upstream_noise.contained():  # executorch warns on import and on every mutated buffer
        from executorch.exir import to_edge_transform_and_lower

        edge = to_edge_transform_and_lower(
            programs,
            transform_passes=transform_passes,
            partitioner=partitioners,
            constant_methods=constant_methods,
            compile_config=compile_config,
        )
        return edge.to_executorch(config)


def _load_program(lowered: PteLowered) -> Program:
    with upstream_noise.contained():
        from executorch.runtime import Runtime

        return Runtime.get().load_program(lowered.path, data_path=lowered.data_path)


def planned_together(programs: dict[str, ExportedProgram]) -> dict[str, dict[str, set[str]]]:
    """method -> each of its state keys whose planned memory (memory id, byte range: the TensorSpecs the
    emitter writes into the .pte) another method's tensors also use -> those methods. ``Runtime.load_program``
    gives every method of a program one set of arenas, so such a state reads what the other method leaves
    there; the same key of another method is sharing by design, not counted."""
    mutable = {fqn for ep in programs.values() for fqn in ep.graph_signature.buffers_to_mutate.values()}
    held: dict[str, dict[str, tuple[int, int, int]]] = {}
    spans: dict[str, list[tuple[str | None, int, int, int]]] = {}
    for method, ep in programs.items():
        buffers = ep.graph_signature.inputs_to_buffers
        held[method], spans[method] = {}, []
        for node in ep.graph.nodes:
            specs = node.meta.get("spec")
            for spec in specs if isinstance(specs, (list, tuple)) else [specs]:
                span = _span(spec)
                if span is None:
                    continue
                fqn = buffers.get(node.name) if node.op == "placeholder" else None
                if fqn is not None and fqn in mutable:
                    held[method][fqn] = span
                spans[method].append((fqn, *span))
    out: dict[str, dict[str, set[str]]] = {}
    for method, states in held.items():
        for fqn, (mem, low, high) in states.items():
            users = {
                other
                for other, theirs in spans.items()
                if other != method
                and any(key != fqn and m == mem and lo < high and low < hi for key, m, lo, hi in theirs)
            }
            if users:
                out.setdefault(method, {})[fqn] = users
    return out


def ownership(programs: dict[str, ExportedProgram], delegated: bool) -> Ownership:
    """Which constants of each lowered method the backend under test holds: with partitioners, those its
    delegates took (each delegate call's own program lists them, the outer program the ones left to the
    portable kernels); without, the portable runtime is what is under test, and holds them all."""
    owned: dict[str, frozenset[str]] = {}
    left: dict[str, frozenset[str]] = {}
    for method, ep in programs.items():
        outer = _constants(ep)
        taken: set[str] = set()
        for node in ep.graph.nodes:
            original = getattr(getattr(ep.graph_module, str(node.target), None), "original_module", None)
            if node.op == "get_attr" and original is not None:
                taken |= _constants(original)
        owned[method], left[method] = (frozenset(taken), outer) if delegated else (outer, frozenset())
    return Ownership(owned, left)


def _constants(ep: ExportedProgram) -> frozenset[str]:
    """The names of the tensors a program holds: parameters, buffers (mutable ones too) and constants."""
    sig = ep.graph_signature
    held = (sig.inputs_to_parameters, sig.inputs_to_buffers, sig.inputs_to_lifted_tensor_constants)
    return frozenset(name for names in held for name in names.values())


def _span(spec: Any) -> tuple[int, int, int] | None:
    """(memory id, first byte, byte past the last) of a planned tensor; None for one the plan does not place
    (a constant, a tensor the runtime allocates)."""
    mem, offset, size = (getattr(spec, a, None) for a in ("mem_id", "mem_offset", "allocated_memory"))
    if not isinstance(mem, int) or not isinstance(offset, int) or not size or getattr(spec, "const", False):
        return None
    return mem, offset, offset + int(size)


def _signatures(programs: dict[str, ExportedProgram]) -> dict[str, MethodSignature]:
    from torch.export.graph_signature import InputKind, OutputKind

    mutable = {fqn for ep in programs.values() for fqn in ep.graph_signature.buffers_to_mutate.values()}
    out = {}
    for method, ep in programs.items():
        sig = ep.graph_signature
        user = [s.arg.name for s in sig.input_specs if s.kind == InputKind.USER_INPUT]
        # The emitter drops buffer-mutation outputs (written back in place) and keeps the rest in order.
        emitted = [s for s in sig.output_specs if s.kind != OutputKind.BUFFER_MUTATION]
        mutations = {
            i: user.index(s.target)
            for i, s in enumerate(emitted)
            if s.kind == OutputKind.USER_INPUT_MUTATION and s.target is not None
        }
        buffers = frozenset(fqn for fqn in sig.inputs_to_buffers.values() if fqn in mutable)
        out[method] = MethodSignature(mutations, buffers)
    return out
