"""A backend repository's own multi-method programs as conformance scenarios (the ``pytest_ptn_programs``
hook): exported and run eagerly the way the catalogue's programs are, named and tagged by what they contain.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from pytest_ptn import upstream_noise
from pytest_ptn.backend import EagerCall
from pytest_ptn.programs.source import (
    Inputs,
    ProgramFormError,
    Source,
    UserProgram,
    copied,
    leaves,
    widened,
    written_state,
)
from pytest_ptn.programs.traits import derived_tags

NAME = re.compile(r"\w+")
"""A program's name is part of test ids and expectation files: letters, digits and underscores."""


class NamedProgramError(ValueError):
    """A user program the suite cannot run as given; the message names the program and what is wrong."""


@dataclass(eq=False)
class NamedProgram:
    """A named multi-method program with its example inputs and the call sequence to check.

    ``model`` is one module whose methods are the keys of ``inputs`` (``getattr(model, name)``), or a mapping
    method name -> module (its forward), callable, ``ExportedProgram`` or constant value, so methods can come
    from separately built modules or an exporter such as optimum-executorch (pytest_ptn.programs.source).
    ``inputs`` gives each method's example inputs (tensors: positional, keywords or ``(args, kwargs)``), used
    to export it; a constant method needs none, and no call runs it. ``calls`` is the sequence of (method,
    inputs) run on eager and on the backend, state carried across calls; by default each method once with
    its example inputs. The backend gets each call's inputs flat, in the exported program's order.

    Every export and eager run starts from a new copy of ``model`` made for inference (eval mode, no grad). A
    program the rules reject cannot be a scenario: methods built separately that start a same-named mutated
    buffer from different values (P7) raise NamedProgramError when made a scenario or run eagerly.
    """

    name: str
    model: Source
    inputs: Mapping[str, Inputs]
    calls: Sequence[tuple[str, Inputs]] = ()
    doc: str = ""
    offset: float = field(default=0.0, repr=False)
    """Added to every floating-point tensor of each copy: S4's second program, the same names holding other
    values (see with_other_values)."""
    _program: UserProgram = field(init=False, repr=False)
    _eager: list[EagerCall] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        where = f"ptn program {self.name!r}"
        if not isinstance(self.name, str) or not NAME.fullmatch(self.name):
            raise NamedProgramError(f"{where}: a name is letters, digits and underscores")
        if not self.inputs:
            raise NamedProgramError(f"{where}: inputs names no method")
        try:
            self._program = UserProgram(self.model, self.inputs, self.offset)
        except ProgramFormError as e:
            raise NamedProgramError(f"{where}: {e}") from e
        for method, args in [*self._program.inputs.items(), *self.calls]:
            if method in self._program.constants:
                raise NamedProgramError(
                    f"{where}: a call to {method!r}, a constant method: no program runs it, leave it out"
                )
            if method not in self._program.inputs:
                raise NamedProgramError(f"{where}: a call to {method!r}, which has no example inputs")
            try:
                tensors = all(isinstance(a, torch.Tensor) for a in leaves(args))
            except ProgramFormError:
                tensors = False
            if not tensors:
                raise NamedProgramError(
                    f"{where}: inputs of {method!r} must be tensors: a tuple, a mapping of keywords, or both"
                )

    @property
    def method_names(self) -> tuple[str, ...]:
        """The methods that are programs (constant methods aside)."""
        return self._program.methods

    @property
    def constant_methods(self) -> tuple[str, ...]:
        """The methods that are values (ExecuTorch's constant methods): named, never lowered or run."""
        return tuple(self._program.constants)

    @property
    def sequence(self) -> tuple[str, ...]:
        """The methods of the call sequence, in order."""
        return tuple(name for name, _ in self.calls or self._program.inputs.items())

    def export(self) -> dict[str, ExportedProgram]:
        """Freshly exported programs, one per method, from one new copy of the model."""
        return self._program.export()

    def eager(self) -> list[EagerCall]:
        """The call sequence run eagerly, computed once."""
        if self._eager is None:
            self._eager = self._run(self.calls or tuple(self._program.inputs.items()))
        return self._eager

    def run_eager(self, sequence: tuple[str, ...]) -> list[EagerCall]:
        """``sequence`` run eagerly with each method's example inputs, on one new copy of the model."""
        return self._run([(name, self._program.inputs[name]) for name in sequence])

    def state_fqns(self) -> dict[str, torch.Tensor]:
        """Initial value of every buffer some method writes, by the FQN export gives it."""
        self._refuse_conflict()
        return self._program.state_fqns()

    def buffer_fqns(self) -> dict[str, torch.Tensor]:
        """Initial value of every buffer of the program, written or only read, by each FQN export gives it."""
        self._refuse_conflict()
        return self._program.buffer_fqns()

    def with_other_values(self) -> NamedProgram:
        """The same program (names, shapes, calls) holding other parameter and buffer values."""
        return dataclasses.replace(self, offset=self.offset + 0.5)

    def scenario(self) -> tuple[UserScenario, dict[str, ExportedProgram]]:
        """This program as a scenario, and the functionalized programs its tags were read from."""
        with upstream_noise.contained():
            inspected = self._program.inspected()
        self._refuse_conflict()
        return UserScenario(self.name, self.doc, self, derived_tags(inspected)), inspected

    def _refuse_conflict(self) -> None:
        conflict = self._program.conflict
        if conflict is not None:
            raise NamedProgramError(
                f"ptn program {self.name!r}: {conflict}; the rules reject such a program (P7), so it cannot "
                f"be a scenario: start the buffer from one value in every method"
            )

    def _modules(self) -> dict[str, nn.Module]:
        """method -> the module that runs it eagerly, all on one new inference copy of the model."""
        self._refuse_conflict()
        return self._program.eager()

    def _run(self, given: Sequence[tuple[str, Inputs]]) -> list[EagerCall]:
        """The calls on eager, their inputs flat as the backend gets them; a reduced-precision program also
        widened to float64 (EagerCall.wide)."""
        self._refuse_conflict()
        with upstream_noise.contained():
            calls = self._program.calls(given)
        out = eager_calls(self._program, calls)
        if self._program.reduced_precision:
            widen(self._program, calls, out)
        return out


def eager_calls(program: UserProgram, calls: Sequence[tuple[str, tuple[Any, ...]]]) -> list[EagerCall]:
    """``calls`` (inputs flat, UserProgram.calls) run eagerly on one new inference copy of ``program``, state
    carried across them: what each gave, and every state some method writes after it."""
    return _calls(program, program.eager(), calls)


def widen(program: UserProgram, calls: Sequence[tuple[str, tuple[Any, ...]]], out: list[EagerCall]) -> None:
    """Give each of ``out`` (``calls`` run eagerly) its run on the program widened to float64
    (EagerCall.wide: how far eager's own rounding moves each value); raises what the widened run raises."""
    wide = [(name, widened(args, torch.float64)) for name, args in calls]
    for call, wide_call in zip(out, _calls(program, program.eager(torch.float64), wide), strict=True):
        call.wide = wide_call


def _calls(
    program: UserProgram, methods: dict[str, nn.Module], calls: Sequence[tuple[str, tuple[Any, ...]]]
) -> list[EagerCall]:
    out = []
    with torch.no_grad():
        for name, args in calls:
            given = tuple(copied(a) for a in args)
            result = methods[name](*given)
            outputs = [t.clone() for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
            after = tuple(copied(a) for a in given)
            out.append(EagerCall(name, args, outputs, after, written_state(program, methods)))
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
