"""What a backend computes for each method of a program alone: the truth isolation is judged against.

A backend's kernels may compute differently from eager (XNNPACK's float32 kernels, OpenVINO's float32 in
bf16, AOTInductor's fused float32 chains in a bf16 program): that is arithmetic, not isolation. The truth for
isolation is the same backend on the program with the hazard removed: each method lowered alone (one method
per program), its state explicit (pytest_ptn.programs.stateless), and the calls threaded through it, each
call given the state the backend's own previous call alone produced. A method of the program that differs
from that has an isolation or sharing defect (E1, E3, E4, E5); a deviation from eager that the method shows
alone too is accuracy (A1). A method is lowered alone only once a program's result differs from eager's, so
a backend that agrees with eager pays nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from pytest_ptn.backend import Backend, Loaded, one_line
from pytest_ptn.instruments.content import digest
from pytest_ptn.programs.stateless import Stateless, stateless


@dataclass(frozen=True)
class CallAlone:
    """What the backend computed for one call of the sequence with the method alone."""

    outputs: list[torch.Tensor]
    inputs_after: list[Any]
    """Every user input after the call: the ones the method mutates as it left them."""
    state_after: dict[str, torch.Tensor]
    """Every buffer some method mutates, after the call."""


class AloneUnavailable(Exception):
    """A method alone did not lower, load or run on the backend: there is no truth to judge isolation by."""


class MethodsAlone:
    """Each method of one program lowered alone on ``backend``, at its first need, and kept.

    ``programs`` gives fresh functional programs of every method (a lowering may consume its own);
    ``initial`` each mutated buffer's initial value by key; ``workdir(name)`` a folder to lower in (each
    method lowers into a folder of its own there);
    ``enter(step)`` is told each backend step before it runs (crash isolation)."""

    def __init__(
        self,
        backend: Backend,
        programs: Callable[[], Mapping[str, ExportedProgram]],
        initial: Mapping[str, torch.Tensor],
        workdir: Callable[[str], Path],
        enter: Callable[[str], None] = lambda step: None,
    ):
        self.backend = backend
        self._programs = programs
        self._initial = dict(initial)
        self._workdir = workdir
        self._enter = enter
        self._fresh: Mapping[str, ExportedProgram] | None = None
        self._methods: dict[str, tuple[Stateless, Loaded] | AloneUnavailable] = {}
        self._runs: dict[tuple[object, ...], list[CallAlone] | AloneUnavailable] = {}

    def run(self, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[CallAlone]:
        """What each call gives with its method alone, state threaded from the initial values;
        AloneUnavailable if a method alone does not lower, load or run (the same for every later ask)."""
        key = tuple((method, *map(identity, args)) for method, args in calls)
        if key not in self._runs:
            try:
                self._runs[key] = self._run(calls)
            except AloneUnavailable as e:
                self._runs[key] = e
        found = self._runs[key]
        if isinstance(found, AloneUnavailable):
            raise found
        return found

    def _run(self, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[CallAlone]:
        state = {k: t.clone() for k, t in self._initial.items()}
        out = []
        for method, args in calls:
            made, loaded = self._method(method)
            given = [state[k].clone() for k in made.state_in]
            self._enter(f"running {method}() alone")
            try:
                flat = loaded.run(method, [*given, *(_copy(a) for a in args)])
            except Exception as e:
                raise AloneUnavailable(f"method {method!r} alone raised {one_line(e)}") from e
            written, inputs_out, outputs = made.split([_copy(v) for v in flat])  # a runtime reuses memory
            state.update(zip(made.state_out, written, strict=True))
            after = list(args)
            for index, value in zip(made.inputs_out, inputs_out, strict=True):
                after[index] = value
            out.append(CallAlone(list(outputs), after, {k: t.clone() for k, t in state.items()}))
        return out

    def _method(self, method: str) -> tuple[Stateless, Loaded]:
        if method not in self._methods:
            try:
                self._methods[method] = self._lower(method)
            except AloneUnavailable as e:
                self._methods[method] = e
        found = self._methods[method]
        if isinstance(found, AloneUnavailable):
            raise found
        return found

    def _lower(self, method: str) -> tuple[Stateless, Loaded]:
        if self._fresh is None:  # one export serves every method: each lowering gets its own method's
            self._fresh = self._programs()
        made = stateless(self._fresh[method], self._initial)
        self._enter(f"lowering {method}() alone")
        try:
            folder = self._workdir(f"alone-{method}") / f"alone-{method}"  # never the program's own
            folder.mkdir(parents=True, exist_ok=True)
            lowered = self.backend.lower({method: made.program}, folder)
        except Exception as e:
            raise AloneUnavailable(f"method {method!r} alone does not lower: {one_line(e)}") from e
        self._enter(f"loading {method}() alone")
        try:
            loaded = self.backend.load(lowered)
            loaded.load_method(method)
        except Exception as e:
            raise AloneUnavailable(f"method {method!r} alone does not load: {one_line(e)}") from e
        return made, loaded


def _copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def identity(value: Any) -> object:
    """What tells one call's argument from another's, to key what a sequence gives."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, tuple(value.shape), digest(value))
    return repr(value)
