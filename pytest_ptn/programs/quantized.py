"""A catalogue program as a backend that quantizes sees it: each method quantized on its own by the backend's
recipe (Backend.quantize), before export, and the converted modules as the truth.

Each method is quantized from its own fresh copy of the program's modules, calibrated with its own example
inputs; calibration runs forward, so every buffer is then put back to its value before calibration. What is
exported for the backend is the converted module itself (never a re-export of another program), so the backend
lowers the graph that eager runs. Eager runs the converted modules with every buffer some method writes tied
to one tensor across methods, as the rules define shared state.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from functools import cached_property

import torch
from torch import nn
from torch.utils import _pytree as pytree

from pytest_ptn.backend import EagerCall
from pytest_ptn.instruments.comparison import Tolerance, close
from pytest_ptn.programs.build import Program
from pytest_ptn.programs.source import find_tensor, set_tensor, tie_state

Quantize = Callable[[nn.Module, tuple[torch.Tensor, ...]], nn.Module]


class QuantizedProgram:
    """``program`` with each method quantized by ``quantize``; a ProgramUnderTest (pytest_ptn.harness)."""

    def __init__(self, program: Program, quantize: Quantize):
        self.program = program
        self._quantize = quantize
        self._eager: list[EagerCall] | None = None

    @property
    def method_names(self) -> tuple[str, ...]:
        return self.program.method_names

    @cached_property
    def converted(self) -> dict[str, nn.Module]:
        """method -> its converted module, buffers as before calibration (read-only: copies are run)."""
        out = {}
        for name in self.method_names:
            module = self.program.modules()[name]
            before = {key: b.clone() for key, b in module.named_buffers()}
            converted = self._quantize(module, self.program.example_inputs(name))
            with torch.no_grad():
                for key, b in converted.named_buffers():
                    if key in before:
                        b.copy_(before[key])
            out[name] = converted
        return out

    def export(self) -> dict[str, torch.export.ExportedProgram]:
        """Fresh exports of the converted modules, one per method."""
        return {
            name: torch.export.export(copy.deepcopy(module), self.program.example_inputs(name), strict=False)
            for name, module in self.converted.items()
        }

    def eager(self) -> list[EagerCall]:
        if self._eager is None:
            self._eager = self.run_eager(self.program.spec.call_sequence)
        return self._eager

    def run_eager(self, sequence: tuple[str, ...]) -> list[EagerCall]:
        """``sequence`` on one fresh copy of the converted modules, shared state tied across methods."""
        modules = self._modules()
        calls = []
        with torch.no_grad():
            for i, name in enumerate(sequence):
                inputs = self.program.example_inputs(name, i)
                given = tuple(t.clone() for t in inputs)
                outputs = [t.clone() for t in pytree.tree_leaves(modules[name](*given))]
                calls.append(
                    EagerCall(name, inputs, outputs, tuple(t.clone() for t in given), self._state(modules))
                )
        return calls

    def state_fqns(self) -> dict[str, torch.Tensor]:
        return self.program.state_fqns()

    def buffer_fqns(self) -> dict[str, torch.Tensor]:
        return self.program.buffer_fqns()

    def with_other_values(self) -> QuantizedProgram:
        return QuantizedProgram(self.program.with_other_values(), self._quantize)

    def read_elsewhere(
        self, call: int, have: torch.Tensor, tolerance: Tolerance | None, calls: list[EagerCall]
    ) -> list[tuple[str, str]]:
        """Whose tensor the backend read at call ``call`` of ``calls``, by what it gave (``have``, the
        method's output): each (method, key) such that running the method's converted module with that other
        method's same-named, different tensor (a ``_frozen_param<i>``, ``_scale_<i>``, ``_zero_point_<i>``,
        from the state eager had before the call) gives ``have``."""
        method = calls[call].method
        state = calls[call - 1].state_after if call else self.state_fqns()
        found = []
        for key, tensor in self._constants(method).items():
            for other, theirs in self._constants_elsewhere(method, key, tensor):
                module = self._modules()[method]
                with torch.no_grad():
                    for k, v in state.items():
                        mine = find_tensor({method: module}, k)
                        if mine is not None:
                            mine.copy_(v)
                    set_tensor(module, key, theirs.clone())
                    got = pytree.tree_leaves(module(*(t.clone() for t in calls[call].inputs)))[0]
                if got.shape == have.shape and bool(close(have, got, None, tolerance).all()):
                    found.append((other, key))
        return found

    def _constants(self, method: str) -> dict[str, torch.Tensor]:
        """The immutable tensors of a method's converted module, by key."""
        mutable = set(self.state_fqns())
        module = self.converted[method]
        tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        return {k: t for k, t in tensors.items() if k not in mutable}

    def _constants_elsewhere(
        self, method: str, key: str, tensor: torch.Tensor
    ) -> list[tuple[str, torch.Tensor]]:
        out = []
        for other in self.method_names:
            theirs = self._constants(other).get(key) if other != method else None
            if theirs is not None and theirs.shape == tensor.shape and not theirs.equal(tensor):
                out.append((other, theirs))
        return out

    def _modules(self) -> dict[str, nn.Module]:
        modules = copy.deepcopy(self.converted)
        tie_state(modules, set(self.state_fqns()))
        return modules

    def _state(self, modules: Mapping[str, nn.Module]) -> dict[str, torch.Tensor]:
        found = {key: find_tensor(modules, key) for key in self.state_fqns()}
        return {key: t.clone() for key, t in found.items() if t is not None}
