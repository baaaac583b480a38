"""A backend repository's own multi-method programs as conformance scenarios (the ``pytest_ptn_programs``
hook): exported and run eagerly the way the catalogue's programs are, named and tagged by what they contain.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from pytest_ptn import upstream_noise
from pytest_ptn.programs.build import EagerCall
from pytest_ptn.programs.exported import functionalize, mutable_keys
from pytest_ptn.programs.traits import derived_tags

Inputs = tuple[torch.Tensor, ...]
NAME = re.compile(r"\w+")
"""A program's name is part of test ids and expectation files: letters, digits and underscores."""


class NamedProgramError(ValueError):
    """A user program the suite cannot run as given; the message names the program and what is wrong."""


class _Callable(nn.Module):
    """A plain callable as the forward of a module, so it can be exported."""

    def __init__(self, fn: Callable[..., Any]):
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> Any:
        return self.fn(*args)


@dataclass(eq=False)
class NamedProgram:
    """A named multi-method program with its example inputs and the call sequence to check.

    ``model`` is one module whose methods are the keys of ``inputs`` (``getattr(model, name)``), or a mapping
    method name -> module (its forward) or plain callable, so methods can come from separately built modules.
    ``inputs`` gives each method's example inputs (tensors), used to export it; ``calls`` is the sequence of
    (method, inputs) run on eager and on the backend, state carried across calls; by default each method
    once with its example inputs.

    Every export and eager run starts from a new deep copy of ``model`` (a plain callable is not copied),
    made for inference: in eval mode, no parameter requiring grad, as when a model is lowered for deployment.
    """

    name: str
    model: nn.Module | Mapping[str, nn.Module | Callable[..., Any]]
    inputs: Mapping[str, Inputs]
    calls: Sequence[tuple[str, Inputs]] = ()
    doc: str = ""
    offset: float = field(default=0.0, repr=False)
    """Added to every floating-point parameter and buffer of each copy: S4's second program, the same names
    holding other values (see with_other_values)."""
    _eager: list[EagerCall] | None = field(default=None, init=False, repr=False)
    _mutable: set[str] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        where = f"ptn program {self.name!r}"
        if not isinstance(self.name, str) or not NAME.fullmatch(self.name):
            raise NamedProgramError(f"{where}: a name is letters, digits and underscores")
        if not self.inputs:
            raise NamedProgramError(f"{where}: inputs names no method")
        if isinstance(self.model, nn.Module):
            missing = [m for m in self.inputs if not callable(getattr(self.model, m, None))]
            if missing:
                raise NamedProgramError(f"{where}: the model has no method {', '.join(missing)}")
        elif set(self.model) != set(self.inputs):
            raise NamedProgramError(
                f"{where}: methods {sorted(self.model)} but inputs for {sorted(self.inputs)}"
            )
        for method, args in [*self.inputs.items(), *self.calls]:
            if method not in self.inputs:
                raise NamedProgramError(f"{where}: a call to {method!r}, which has no example inputs")
            if not isinstance(args, tuple) or not all(isinstance(a, torch.Tensor) for a in args):
                raise NamedProgramError(f"{where}: inputs of {method!r} must be a tuple of tensors")

    @property
    def method_names(self) -> tuple[str, ...]:
        return tuple(self.inputs)

    def export(self) -> dict[str, ExportedProgram]:
        """Freshly exported programs, one per method, from one new copy of the model."""
        methods = self._fresh()
        return {
            name: torch.export.export(methods[name], args, strict=False) for name, args in self.inputs.items()
        }

    def eager(self) -> list[EagerCall]:
        """The call sequence run eagerly, computed once."""
        if self._eager is None:
            self._eager = self._run(self.calls or tuple(self.inputs.items()))
        return self._eager

    def run_eager(self, sequence: tuple[str, ...]) -> list[EagerCall]:
        """``sequence`` run eagerly with each method's example inputs, on one new copy of the model."""
        return self._run([(name, self.inputs[name]) for name in sequence])

    def state_fqns(self) -> dict[str, torch.Tensor]:
        """Initial value of every buffer some method writes, by the FQN export gives it."""
        return self._state(self._fresh())

    def with_other_values(self) -> NamedProgram:
        """The same program (names, shapes, calls) holding other parameter and buffer values."""
        return dataclasses.replace(self, offset=self.offset + 0.5)

    def scenario(self) -> tuple[UserScenario, dict[str, ExportedProgram]]:
        """This program as a scenario, and the functionalized programs its tags were read from."""
        with upstream_noise.contained():
            inspected = functionalize(self.export())
        return UserScenario(self.name, self.doc, self, derived_tags(inspected)), inspected

    def _fresh(self) -> dict[str, nn.Module]:
        """method -> the module whose forward runs it, all on one new inference copy of the model."""
        model = copy.deepcopy(self.model)
        roots = (
            [model]
            if isinstance(model, nn.Module)
            else [m for m in model.values() if isinstance(m, nn.Module)]
        )
        for root in roots:
            root.eval()  # lowered for inference: no dropout, batch-norm running statistics
        tensors = {id(t): t for root in roots for t in [*root.parameters(), *root.buffers()]}
        with torch.no_grad():
            for t in tensors.values():
                t.requires_grad_(False)
                if t.is_floating_point():
                    t.add_(self.offset)
        if isinstance(model, nn.Module):
            return {name: _as_forward(model, name) for name in self.inputs}
        return {n: m if isinstance(m, nn.Module) else _Callable(m) for n, m in model.items()}

    def _state(self, methods: dict[str, nn.Module]) -> dict[str, torch.Tensor]:
        if self._mutable is None:
            self._mutable = mutable_keys(self.export())
        return {
            fqn: b.clone()
            for module in methods.values()
            for fqn, b in module.named_buffers()
            if fqn in self._mutable
        }

    def _run(self, calls: Sequence[tuple[str, Inputs]]) -> list[EagerCall]:
        methods = self._fresh()
        out = []
        with torch.no_grad():
            for name, args in calls:
                given = tuple(t.clone() for t in args)
                result = methods[name](*given)
                outputs = [t.clone() for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
                after = tuple(t.clone() for t in given)
                out.append(EagerCall(name, args, outputs, after, self._state(methods)))
        return out


@dataclass(frozen=True)
class UserScenario:
    """A user program in the conformance matrix, beside the catalogue's Scenarios: valid (it must lower), and
    tagged by what its exported programs contain (pytest_ptn.programs.traits)."""

    name: str
    doc: str
    program: NamedProgram
    tags: frozenset[str]
    valid: ClassVar[bool] = True
    needs: ClassVar[frozenset[str]] = frozenset()


def _as_forward(model: nn.Module, method: str) -> nn.Module:
    """A shallow copy of ``model`` whose forward is ``model.<method>``: the same parameters and buffers under
    the same FQNs, so every method's export names one tensor alike."""
    view = copy.copy(model)
    view.forward = getattr(model, method)
    return view


def by_name(programs: Sequence[object], taken: Collection[str]) -> dict[str, NamedProgram]:
    """The hook's answers by name: each a NamedProgram, its name unique and none of ``taken`` (the
    catalogue's names, the words expectation files reserve)."""
    out: dict[str, NamedProgram] = {}
    for program in programs:
        if not isinstance(program, NamedProgram):
            raise NamedProgramError(f"expected NamedProgram objects, got {type(program).__name__}")
        if program.name in taken or program.name in out:
            raise NamedProgramError(f"program name {program.name!r} is taken: give each program its own")
        out[program.name] = program
    return out
