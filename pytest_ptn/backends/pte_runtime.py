"""A runtime of ``.pte`` files: your interpreter of what ExecuTorch's lowering writes, judged on its own.

    from pytest_ptn.backends.pte_runtime import PteRuntime

    class MyRuntime(PteRuntime):
        name = "myrt"

        def load_pte(self, program, data):
            return myrt.load(program, data)  # anything with run(method, inputs) -> outputs

``--ptn-backend=myrt`` then runs the suite once per lowering the runtime supports (``lowerings``, all of
``LOWERINGS`` by default: ``myrt@portable``, ``myrt@shared-state``, ...): each lowering is executorch's own
(pytest_ptn.backends.pte), so a runtime that ignores ``share_mutable_buffers`` is caught by
``myrt@shared-state`` without a backend of its own. Every failure says whose it is: the same ``.pte`` run by
executorch.runtime (the witness) gives the same values (the lowering's, or upstream's) or eager's (the
runtime's own). A runtime in another interpreter is one whose ``load_pte`` returns a proxy of it
(tests/remote_runtimes.py hands the .pte's bytes to a worker process). ``python -m pytest_ptn new-backend
NAME --runtime`` writes a package with such a class to fill in.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from pytest_ptn.backend import Availability, Backend, BackendNotFound, Capability, Loaded, Lowered, Witness
from pytest_ptn.backends.pte import (
    ExternalConstantsBackend,
    PteBackend,
    PteLowered,
    SharedStateBackend,
    XnnpackBackend,
)

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

LOWERINGS: dict[str, type[PteBackend]] = {
    "portable": PteBackend,
    "shared-state": SharedStateBackend,
    "external": ExternalConstantsBackend,
    "xnnpack": XnnpackBackend,
}
"""The lowerings a runtime of .pte files is run with, by variant name: portable kernels; mutable buffers
shared across methods and initialised (``share_mutable_buffers``, the KV-cache recipe); constants in a
``.ptd``; the XNNPACK delegate."""


class RuntimeProgram(Protocol):
    """What ``PteRuntime.load_pte`` returns: one loaded copy of a .pte, state its own."""

    def run(self, method: str, inputs: list[torch.Tensor]) -> Sequence[torch.Tensor]:
        """The method's outputs as ``Method.execute`` gives them (mutated user inputs among them)."""


class PteRuntime(Backend):
    """Your runtime of .pte files: implement ``load_pte`` (and ``availability``, which says whether your
    runtime is here); pick ``lowerings`` if it supports fewer than all."""

    capabilities = frozenset({Capability.EXECUTE})
    lowerings: ClassVar[tuple[str, ...]] = tuple(LOWERINGS)
    """The names in ``LOWERINGS`` this runtime runs: leave out one whose programs it cannot run at all."""
    lowering: ClassVar[str | None] = None
    """The lowering this class runs with; None for the class you write, which stands for its ``lowerings``."""

    @abstractmethod
    def load_pte(self, program: Path, data: Path | None) -> RuntimeProgram:
        """Load a fresh copy of the .pte at ``program`` (and its .ptd ``data``, for the external lowering)."""

    @classmethod
    def availability(cls) -> Availability:
        """executorch's, which the lowering and the witness need: override it to say whether your runtime is
        here too."""
        return LOWERINGS[cls.lowering or "portable"].availability()

    @classmethod
    def load_runtime(cls) -> None:
        """executorch.runtime, which the witness runs (its import warnings contained): a runtime whose own
        needs loading first calls this too."""
        LOWERINGS[cls.lowering or "portable"].load_runtime()

    @classmethod
    def variants(cls) -> tuple[str, ...]:
        return cls.lowerings if cls.lowering is None else ()

    @classmethod
    def variant(cls, variant: str) -> type[Backend]:
        if cls.lowering is not None or variant not in cls.lowerings:
            return super().variant(variant)
        unknown = [name for name in cls.lowerings if name not in LOWERINGS]
        if unknown:
            raise BackendNotFound(f"{cls.name!r}: no lowering {unknown} (lowerings: {', '.join(LOWERINGS)})")
        attrs = {
            "name": f"{cls.name}@{variant}",
            "lowering": variant,
            "variant_of": (cls, variant),
            "capabilities": cls.capabilities,
            "__module__": cls.__module__,
            "__doc__": cls.__doc__,
        }
        return type(f"{cls.__name__}_{variant.replace('-', '_')}", (cls,), attrs)

    def _lowering(self) -> PteBackend:
        if self.lowering is None:
            raise BackendNotFound(f"{self.name!r} stands for its lowerings: ask for {self.name}@<lowering>")
        return LOWERINGS[self.lowering]()

    def lower(self, programs: dict[str, ExportedProgram], workdir: Path) -> PteLowered:
        return self._lowering().lower(programs, workdir)

    def load(self, lowered: Lowered) -> RuntimeLoaded:
        assert isinstance(lowered, PteLowered)
        return RuntimeLoaded(self.load_pte(lowered.path, lowered.data_path), lowered)

    def witness(self, lowered: Lowered) -> Witness:
        return Witness(self._lowering().load(lowered), "executorch.runtime on the same .pte")


class RuntimeLoaded(Loaded):
    """A runtime's copy of a .pte, its flat outputs read as the lowering wrote them (mutated inputs)."""

    def __init__(self, program: RuntimeProgram, lowered: PteLowered):
        self.program = program
        self._lowered = lowered

    def load_method(self, method: str) -> None:
        load = getattr(self.program, "load_method", None)
        if load is not None:
            load(method)

    def run(self, method: str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        outputs = list(self.program.run(method, list(inputs)))
        mutations = self._lowered.methods[method].input_mutations
        for out, index in mutations.items():
            inputs[index].copy_(outputs[out])
        return [t for i, t in enumerate(outputs) if i not in mutations]
