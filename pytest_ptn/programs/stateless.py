"""One method as a pure function of its state, under names of its own: what a backend lowers when the
method is judged alone.

A program's methods share state (a KV cache one writes and another reads) and a loaded program keeps it
between calls; that is where isolation can break. The same method with its state made explicit, every
buffer some method of the program mutates taken as an input before the user's and every buffer it writes
(and every user input it mutates) returned before its outputs, holds no state at all. Its constants are
renamed under a prefix made from their bytes, so no cache that keys by name (the very hazard under test, and
process-wide in the CUDA delegate) can hand it a tensor another program loaded under the same name: lowered
alone, it computes what the backend's kernels compute, nothing any other method or load could change. The
graph is the functional program's own, node for node (only the signature and the keys change), so the
backend lowers the arithmetic it lowers in the program.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram, ModuleCallEntry, ModuleCallSignature
from torch.export.graph_signature import ExportGraphSignature, InputKind, OutputKind
from torch.utils import _pytree as pytree

from pytest_ptn.instruments.content import digest
from pytest_ptn.programs.exported import call_graph_copy, private_copy


@dataclass(frozen=True)
class Stateless:
    """A method made stateless, and how its flat inputs and outputs line up with the stateful one's: called
    as ``(*state_in values, *user inputs)``, it returns ``(*state_out, *mutated user inputs, *outputs)``."""

    program: ExportedProgram
    state_in: tuple[str, ...]
    """The keys of the buffers given before the user inputs, in order."""
    state_out: tuple[str, ...]
    """The keys of the buffers the first outputs are, in order."""
    inputs_out: tuple[int, ...]
    """The user inputs (by position) whose values after the call follow ``state_out``."""

    def split(self, flat: list[Any]) -> tuple[list[Any], list[Any], list[Any]]:
        """A call's flat results as (state after, user inputs after, outputs)."""
        state, after = len(self.state_out), len(self.state_out) + len(self.inputs_out)
        return flat[:state], flat[state:after], flat[after:]


def stateless(ep: ExportedProgram, state: Mapping[str, torch.Tensor]) -> Stateless:
    """``ep``, a functional program (pytest_ptn.programs.exported.functionalize), with each buffer whose key
    is in ``state`` (key -> its initial value) an input and each of its mutations an output, its constants
    under keys of their own (``own_keys``). ``ep`` itself is left as it is. Its example inputs, where ``ep``
    has them (a lowering may trace or calibrate with them), are the initial state before ``ep``'s own."""
    sig = ep.graph_signature
    keys = own_keys(ep, state)
    root, graph = private_copy(ep.graph_module, {})
    placeholders = {node.name: node for node in graph.find_nodes(op="placeholder")}
    kept, given, user, state_specs = [], [], [], []
    for spec in sig.input_specs:
        if spec.kind == InputKind.BUFFER and spec.target in state:
            state_specs.append(spec)
            given.append(dataclasses.replace(spec, kind=InputKind.USER_INPUT, target=None, persistent=None))
        elif spec.kind == InputKind.USER_INPUT:
            user.append(spec)
        else:
            kept.append(dataclasses.replace(spec, target=keys.get(spec.target, spec.target)))
    if user:  # placeholders stand in the order of the signature's inputs
        first = placeholders[user[0].arg.name]
        for spec in given:
            first.prepend(placeholders[spec.arg.name])
    user_index = {spec.arg.name: i for i, spec in enumerate(user)}
    # state written first, then user inputs written, then the outputs: the graph's results in that order
    rank = {OutputKind.BUFFER_MUTATION: 0, OutputKind.USER_INPUT_MUTATION: 1}
    order = sorted(range(len(sig.output_specs)), key=lambda i: rank.get(sig.output_specs[i].kind, 2))
    specs = [sig.output_specs[i] for i in order]
    (output,) = graph.find_nodes(op="output")
    output.args = (tuple(output.args[0][i] for i in order),)
    outputs = [
        dataclasses.replace(s, kind=OutputKind.USER_OUTPUT, target=None) if s.kind in rank else s
        for s in specs
    ]
    state_in = tuple(str(spec.target) for spec in sig.input_specs if spec in state_specs)
    call = ModuleCallSignature(
        inputs=[],
        outputs=[],
        in_spec=pytree.tree_structure((tuple(range(len(given) + len(user))), {})),
        out_spec=pytree.tree_structure(tuple(range(len(outputs)))),
    )
    program = ExportedProgram(
        root=root,
        graph=graph,
        graph_signature=ExportGraphSignature(input_specs=[*kept, *given, *user], output_specs=outputs),
        state_dict={keys[k]: v for k, v in ep.state_dict.items() if k not in state},
        range_constraints=copy.deepcopy(ep.range_constraints),
        module_call_graph=[ModuleCallEntry("", call), *call_graph_copy(ep.module_call_graph[1:])],
        constants={keys.get(k, k): v for k, v in ep.constants.items()},
        example_inputs=_example_inputs(ep, [state[key] for key in state_in]),
        verifiers=list(ep.verifiers),
    )
    return Stateless(
        program,
        state_in=state_in,
        state_out=tuple(str(s.target) for s in specs if s.kind == OutputKind.BUFFER_MUTATION),
        inputs_out=tuple(
            user_index[str(s.target)] for s in specs if s.kind == OutputKind.USER_INPUT_MUTATION
        ),
    )


def _example_inputs(
    ep: ExportedProgram, state: list[torch.Tensor]
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The stateless program's example inputs: the state's initial values, then ``ep``'s own, flat."""
    if ep.example_inputs is None:
        return None
    return (tuple(t.clone() for t in state) + tuple(pytree.tree_leaves(ep.example_inputs)), {})


def own_keys(ep: ExportedProgram, state: Collection[str]) -> dict[str, str]:
    """Each constant key of ``ep`` but the ``state`` ones -> itself under a prefix made from every constant's
    key and bytes: the same method holding the same tensors gets the same names (a compile cache still hits),
    any other gets others."""
    h = hashlib.sha256()
    tensors = {**ep.state_dict, **{k: v for k, v in ep.constants.items() if isinstance(v, torch.Tensor)}}
    constant = sorted(k for k in tensors if k not in state)
    for key in constant:
        h.update(f"{key}\0{digest(tensors[key].detach())}\0".encode())
    prefix = f"alone_{h.hexdigest()[:12]}"
    return {key: f"{prefix}.{key}" for key in constant}
