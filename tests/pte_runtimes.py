"""Runtimes of .pte files as a backend author writes them (pytest_ptn.backends.pte_runtime): executorch's
runtime wrapped, correctly and with the two faults a runtime of its own shows most. The suite runs each on
every lowering and says whose each failure is (tests/test_pte_runtime.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from pytest_ptn.backends.pte_runtime import PteRuntime


def _program(program: Path, data: Path | None) -> Any:
    from executorch.runtime import Runtime

    return Runtime.get().load_program(program, data_path=data)


class _Executorch:
    """executorch.runtime's Program, each method loaded at its first call."""

    def __init__(self, program: Path, data: Path | None):
        self.program = _program(program, data)
        self.methods: dict[str, Any] = {}

    def load_method(self, method: str) -> None:
        if method not in self.methods:
            self.methods[method] = self.program.load_method(method)

    def run(self, method: str, inputs: list[torch.Tensor]) -> Sequence[torch.Tensor]:
        self.load_method(method)
        return self.methods[method].execute(inputs)


class ExecutorchRuntime(PteRuntime):
    """A correct wrapper: every failure it gets is the lowering's, or upstream's."""

    name = "et-runtime"

    def load_pte(self, program: Path, data: Path | None) -> _Executorch:
        return _Executorch(program, data)


class _ForgetsState(_Executorch):
    """Starts afresh whenever another method is called than the last one: state one method wrote is gone."""

    def __init__(self, program: Path, data: Path | None):
        super().__init__(program, data)
        self.files, self.last = (program, data), None

    def run(self, method: str, inputs: list[torch.Tensor]) -> Sequence[torch.Tensor]:
        if self.last not in (None, method):
            self.program, self.methods = _program(*self.files), {}
        self.last = method
        return super().run(method, inputs)


class ForgetsState(PteRuntime):
    """The runtime drops the state written by one method before the next one runs."""

    name = "forgets-state"

    def load_pte(self, program: Path, data: Path | None) -> _Executorch:
        return _ForgetsState(program, data)


class _ProgramPerMethod(_Executorch):
    """Loads each method from a Program of its own: buffers the lowering planned as one are one per method."""

    def __init__(self, program: Path, data: Path | None):
        super().__init__(program, data)
        self.files = (program, data)

    def load_method(self, method: str) -> None:
        if method not in self.methods:
            self.methods[method] = _program(*self.files).load_method(method)


class IgnoresSharedBuffers(PteRuntime):
    """The runtime ignores ``share_mutable_buffers=True``: decode never sees prefill's cache writes."""

    name = "ignores-shared-buffers"

    def load_pte(self, program: Path, data: Path | None) -> _Executorch:
        return _ProgramPerMethod(program, data)
