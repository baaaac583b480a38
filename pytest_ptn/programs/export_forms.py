"""torch.export's result for a method module whose graph was exported before under other constant names
and values, rebound instead of traced again.

Tracing costs 12-75 ms a method, a fixed cost of torch's whatever the graph, and the fuzz test draws each
method's graph from a bounded menu (pytest_ptn.strategies): most of its methods are a graph seen before with
other names and values. The caller says what the export depends on besides names and tensor values (an
*export key*, from the program's spec) and each constant's FQN by position; a form is served only when the
export it came from named its placeholders exactly as torch names them from those FQNs, so the program a
form makes is the one a fresh export makes (tests/test_export_forms.py checks that on every catalogue
scenario and on drawn programs).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from pytest_ptn.programs.exported import (
    CONSTANT_KINDS,
    RecentForms,
    call_graph_copy,
    private_copy,
    renamed_signature,
)

_PREFIX = {InputKind.PARAMETER: "p_", InputKind.BUFFER: "b_", InputKind.CONSTANT_TENSOR: "c_"}


def placeholder_name(kind: InputKind, target: str) -> str:
    """The placeholder torch's export gives constant ``target`` of ``kind`` (torch._export.utils'
    placeholder naming, before any suffix it adds to tell two apart)."""
    return _PREFIX[kind] + re.sub(r"[^a-zA-Z0-9]", "_", re.sub(r"[^a-zA-Z0-9]", "_", target).lower())


@dataclass(frozen=True)
class ExportForm:
    """An exported method without its tensors, plus the tensors export made itself (literals created in
    ``forward``), which are the same for every program of the key."""

    graph_module: torch.fx.GraphModule
    graph_signature: Any
    range_constraints: dict[Any, Any]
    module_call_graph: list[Any]
    verifiers: list[Any]
    fqns: tuple[str, ...]
    """The FQN of each of the program's constants, by the position the key gives it."""
    state_keys: tuple[str, ...]
    constant_keys: tuple[str, ...]
    minted: dict[str, torch.Tensor]

    @classmethod
    def of(cls, ep: ExportedProgram, fqns: tuple[str, ...]) -> ExportForm | None:
        """``ep``'s form, or None when its names do not follow from ``fqns`` alone (torch suffixed a
        placeholder, or a key is neither one of them nor a tensor export made)."""
        known = set(fqns)
        for spec in ep.graph_signature.input_specs:
            if spec.kind in CONSTANT_KINDS:
                assert spec.target is not None
                if spec.target in known and spec.arg.name != placeholder_name(spec.kind, spec.target):
                    return None
        minted = {k: v.detach().clone() for k, v in ep.constants.items() if k not in known}
        if any(k in known for k in minted) or not set(ep.state_dict) <= known:
            return None
        return cls(
            copy.deepcopy(ep.graph_module),
            copy.deepcopy(ep.graph_signature),
            copy.deepcopy(ep.range_constraints),
            call_graph_copy(ep.module_call_graph),
            list(ep.verifiers),
            fqns,
            tuple(ep.state_dict),
            tuple(ep.constants),
            minted,
        )

    def bind(
        self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], fqns: tuple[str, ...]
    ) -> ExportedProgram | None:
        """The export of ``module`` (this form's graph under other names, holding ``module``'s tensors), or
        None when a new name would clash with another node's or with a tensor export made (torch names
        those anew, around the program's own)."""
        if not self.minted.keys().isdisjoint(fqns):
            return None
        keys = dict(zip(self.fqns, fqns, strict=True))
        placeholders = {}
        for spec in self.graph_signature.input_specs:
            if spec.kind in CONSTANT_KINDS and spec.target in keys:
                placeholders[spec.arg.name] = placeholder_name(spec.kind, keys[spec.target])
        others = {n.name for n in self.graph_module.graph.nodes} - set(placeholders)
        if len(set(placeholders.values())) != len(placeholders) or others & set(placeholders.values()):
            return None
        root, graph = private_copy(self.graph_module, placeholders)

        def tensor(key: str) -> torch.Tensor:
            if key in self.minted:
                return self.minted[key].clone()
            owner: Any = module
            for part in keys[key].split("."):
                owner = getattr(owner, part)
            assert isinstance(owner, torch.Tensor)
            return owner

        return ExportedProgram(
            root=root,
            graph=graph,
            graph_signature=renamed_signature(self.graph_signature, placeholders, keys),
            state_dict={keys[k]: tensor(k) for k in self.state_keys},
            range_constraints=copy.deepcopy(self.range_constraints),
            module_call_graph=call_graph_copy(self.module_call_graph),
            example_inputs=(inputs, {}),
            constants={keys.get(k, k): tensor(k) for k in self.constant_keys},
            verifiers=self.verifiers,
        )


class ExportForms:
    """Export forms by export key, the most recent ``size`` kept; ``reused`` and ``exported`` count the
    methods served each way."""

    def __init__(self, size: int):
        self._forms: RecentForms[ExportForm] = RecentForms(size)
        self.reused = 0
        self.exported = 0

    def export(
        self,
        module: torch.nn.Module,
        inputs: tuple[torch.Tensor, ...],
        key: str | None,
        fqns: tuple[str, ...] = (),
    ) -> ExportedProgram:
        """``torch.export.export(module, inputs, strict=False)``, from the form of ``key`` when there is one
        (None: a module this cache cannot key)."""
        known, form = self._forms.get(key) if key is not None else (False, None)
        if form is not None:
            bound = form.bind(module, inputs, fqns)
            if bound is not None:
                with self._forms.lock:
                    self.reused += 1
                return bound
        ep = torch.export.export(module, inputs, strict=False)
        with self._forms.lock:
            self.exported += 1
        if key is not None and not known:
            self._forms.add(key, ExportForm.of(ep, fqns))
        return ep


EXPORT_FORMS = ExportForms(size=256)
"""One per process: forms hold graphs, metadata and the small tensors export minted."""
