"""The user's program in any of the forms upstream lowers from, as fresh exports and an eager truth.

A program is one ``nn.Module`` whose methods are named, a mapping of method name -> ``nn.Module`` (its
forward) or callable, or a mapping of method name -> ``ExportedProgram``. Everything is taken from one deep
copy made up front, so the caller's objects are never run or mutated, and modules shared between entries stay
shared in every copy.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch

from pytest_ptn.programs.exported import functionalize, mutable_keys

Source = torch.nn.Module | Mapping[str, torch.nn.Module | Callable[..., Any] | torch.export.ExportedProgram]


class MethodOf(torch.nn.Module):
    """One method of ``owner`` as a forward; ``owner`` is a child, so its FQNs are prefixed ``model.``."""

    def __init__(self, owner: torch.nn.Module, name: str):
        super().__init__()
        self.model = owner
        self.method = name

    def forward(self, *args: Any) -> Any:
        return getattr(self.model, self.method)(*args)


class Function(torch.nn.Module):
    """A plain callable as a forward: tensors it closes over are exported as constants."""

    def __init__(self, function: Callable[..., Any]):
        super().__init__()
        self.function = function

    def forward(self, *args: Any) -> Any:
        return self.function(*args)


def as_module(entry: torch.nn.Module | Callable[..., Any]) -> torch.nn.Module:
    """The module to export for a mapping's entry: a bound method of a module keeps that module's FQNs."""
    if isinstance(entry, torch.nn.Module):
        return MethodOf(entry, "forward")
    owner = getattr(entry, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        return MethodOf(owner, entry.__name__)
    return Function(entry)


class UserProgram:
    """Fresh exports of the user's program, and eager runs of it, each from an untouched copy."""

    def __init__(self, source: Source, methods: Mapping[str, tuple[Any, ...]]):
        if not isinstance(source, torch.nn.Module | Mapping):
            raise TypeError(
                f"a program is an nn.Module or a mapping of method name -> module, callable or "
                f"ExportedProgram, not {type(source).__name__}"
            )
        if isinstance(source, Mapping) and set(source) != set(methods):
            raise ValueError(f"the program has methods {sorted(source)}, the inputs name {sorted(methods)}")
        self.methods = dict(methods)
        self._source = copy.deepcopy(source)
        for module in [self._source] if isinstance(self._source, torch.nn.Module) else self._source.values():
            if isinstance(module, torch.nn.Module):
                module.eval()  # lowered for inference: no dropout, batch-norm running statistics
        self._inspected: dict[str, torch.export.ExportedProgram] | None = None

    @property
    def is_exported(self) -> bool:
        return isinstance(self._source, Mapping) and all(
            isinstance(v, torch.export.ExportedProgram) for v in self._source.values()
        )

    def export(self) -> dict[str, torch.export.ExportedProgram]:
        """New ExportedPrograms (a lowering may consume them), one per method, from one fresh copy."""
        fresh = copy.deepcopy(self._source)
        modules: dict[str, torch.nn.Module] = {}
        if isinstance(fresh, torch.nn.Module):
            modules = {name: MethodOf(fresh, name) for name in self.methods}
        elif self.is_exported:
            return {name: as_exported(fresh[name]) for name in self.methods}
        else:
            modules = {name: as_module(fresh[name]) for name in self.methods}
        return {
            name: torch.export.export(modules[name], args, strict=False)
            for name, args in self.methods.items()
        }

    def inspected(self) -> dict[str, torch.export.ExportedProgram]:
        """Functional programs to read constants and mutations from (computed once: read-only)."""
        if self._inspected is None:
            self._inspected = functionalize(self.export())
        return self._inspected

    def eager(self) -> dict[str, torch.nn.Module]:
        """The methods as modules on one fresh copy, state carried between calls as eager does; a tensor is
        found in them by the key the exported programs give it.

        For ExportedPrograms that is ``ep.module()`` of each, with every mutated buffer tied by name across
        methods (one ``state/k``, as the rules define the program)."""
        if self.is_exported:
            return exported_eager(self.export(), mutable_keys(self.inspected()))
        fresh = copy.deepcopy(self._source)
        if isinstance(fresh, torch.nn.Module):
            return {name: MethodOf(fresh, name) for name in self.methods}
        return {name: as_module(fresh[name]) for name in self.methods}


def as_exported(entry: object) -> torch.export.ExportedProgram:
    assert isinstance(entry, torch.export.ExportedProgram)
    return entry


def exported_eager(
    programs: Mapping[str, torch.export.ExportedProgram], mutable: set[str]
) -> dict[str, torch.nn.Module]:
    """``ep.module()`` of each program, the buffers in ``mutable`` one tensor per name across methods."""
    modules: dict[str, torch.nn.Module] = {
        name: ep.module(check_guards=False) for name, ep in programs.items()
    }
    state: dict[str, torch.Tensor] = {}
    for module in modules.values():
        for key, tensor in list(module.named_buffers()):
            if key in mutable:
                set_tensor(module, key, state.setdefault(key, tensor))
    return modules


def set_tensor(module: torch.nn.Module, key: str, tensor: torch.Tensor) -> None:
    """Bind ``tensor`` at the dotted ``key`` of ``module`` (a parameter, buffer or plain attribute)."""
    path, _, leaf = key.rpartition(".")
    owner = module.get_submodule(path)
    if isinstance(getattr(owner, leaf, None), torch.nn.Parameter):
        tensor = torch.nn.Parameter(tensor, requires_grad=False)
    setattr(owner, leaf, tensor)


def find_tensor(modules: Mapping[str, torch.nn.Module], key: str) -> torch.Tensor | None:
    """The tensor at the dotted ``key`` of the first of ``modules`` that has one."""
    path, _, leaf = key.rpartition(".")
    for module in modules.values():
        try:
            value = getattr(module.get_submodule(path), leaf)
        except AttributeError:
            continue
        if isinstance(value, torch.Tensor):
            return value
    return None
