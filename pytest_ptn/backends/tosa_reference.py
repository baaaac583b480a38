"""Programs lowered to Arm's TOSABackend, run method by method on the TOSA reference model.

No ExecuTorch runtime here registers a TOSABackend, so a .pte of the TOSA flows cannot load; Arm's own tester
runs them instead by calling each method's lowered graph in Python with executorch's
``TosaReferenceModelDispatch`` active: every ``executorch_call_delegate`` to TOSABackend runs the lowered
module's payload (``processed_bytes``, the TOSA flatbuffer) on ``tosa_reference_model`` (from tosa-tools),
and the rest of the graph runs as its edge operators in PyTorch. This runner does the same for each method
of the program lowered together.

Each call runs on its own: the reference model keeps nothing between calls, so a mutable buffer written by
one call and read by the next (a KV cache, a counter shared by two methods) has no runtime to live in. Such
programs are refused (``written``), never run and passed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_ptn import upstream_noise
from pytest_ptn.backend import Loaded, Lowered, Ownership
from pytest_ptn.backends import pte

if TYPE_CHECKING:
    import torch
    from executorch.exir import ExecutorchProgramManager

DELEGATE = "TOSABackend"
"""The delegate whose payloads this runner executes."""
MODULE = "tosa_reference_model"
DISTRIBUTION = "tosa-tools"
RUNS = (
    f"each method's TOSA payload runs on the TOSA reference model ({MODULE}), the rest of its graph as "
    "edge operators in PyTorch, as Arm's tester runs it: no TOSABackend runtime here, so state carried "
    "between calls (a mutable buffer) is not applicable"
)
"""What a reader of this runner's results must know, one line."""
STATEFUL = (
    "the TOSA reference model runs each call on its own and keeps nothing between calls: a mutable buffer "
    "that one call writes and a later one reads has no runtime to live in"
)


def missing() -> str | None:
    """Why the reference model cannot run here, or None."""
    if importlib.util.find_spec(MODULE) is None:
        return f"the TOSA reference model is not installed (module {MODULE} of {DISTRIBUTION})"
    return None


def written(program: ExecutorchProgramManager) -> list[str]:
    """The buffers some method of the lowered program writes (its graphs are functional by then, so their
    signatures list every one): what a call would have to leave for the next."""
    return sorted(
        {
            fqn
            for method in program.methods
            for fqn in program.exported_program(method).graph_signature.buffers_to_mutate.values()
        }
    )


class ReferenceModelLowered(Lowered):
    """The program as ``to_executorch`` made it: written as a .pte (which no runtime here loads) and kept in
    memory, where each method's graph and delegate payloads are read."""

    def __init__(self, path: Path, program: ExecutorchProgramManager, methods: list[str]):
        self.path = path
        self.program = program
        self.methods = methods

    def ownership(self) -> Ownership:
        """What the TOSA delegates took: a TOSA flow always partitions."""
        return pte.ownership({m: self.program.exported_program(m) for m in self.methods}, delegated=True)


class ReferenceModelLoaded(Loaded):
    """One copy of the program: each method's graph module made once, on first use, its own."""

    def __init__(self, lowered: ReferenceModelLowered):
        self._lowered = lowered
        self._modules: dict[str, torch.fx.GraphModule] = {}

    def _module(self, method: str) -> torch.fx.GraphModule:
        import torch

        if method not in self._modules:
            if method not in self._lowered.methods:
                raise KeyError(f"no method {method!r} in {self._lowered.path} (has {self._lowered.methods})")
            module = self._lowered.program.exported_program(method).module()
            assert isinstance(module, torch.fx.GraphModule)
            self._modules[method] = module
        return self._modules[method]

    def load_method(self, method: str) -> None:
        self._module(method)

    def run(self, method: str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The method's graph with every TOSABackend delegate call run on the reference model; a method the
        partitioner left wholly undelegated runs as edge operators alone (the dispatch refuses a call that
        delegates nothing). A user input the method mutates is written back by the graph itself."""
        import torch
        from torch.utils import _pytree as pytree

        module = self._module(method)
        with upstream_noise.contained():
            from executorch.backends.arm.test.runner_utils import TosaReferenceModelDispatch

            delegated = any(
                n.target is torch.ops.higher_order.executorch_call_delegate for n in module.graph.nodes
            )
            if delegated:
                with TosaReferenceModelDispatch():
                    out: Any = module(*inputs)
            else:
                out = module(*inputs)
        flat: list[torch.Tensor] = pytree.tree_leaves(out)
        return flat
