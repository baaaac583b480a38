"""A user's multi-method program in any form upstream lowers from, as fresh exports and eager modules.

A program is one ``nn.Module`` whose methods are named, or a mapping of method name -> ``nn.Module`` (its
forward), callable or ``ExportedProgram`` (methods built or exported separately). Both doors take it:
``pytest_ptn.check.check_program`` and the ``pytest_ptn_programs`` hook's ``NamedProgram``. Every export and
eager run starts from a new deep copy of it (a plain function is not copied), made for inference: modules in
eval mode, no tensor requiring grad, as when a model is lowered for deployment. Tensors keep the user's own
names (FQNs): a method of one module is exported from a shallow copy of that module whose forward is the
method, so every method names one tensor alike.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from functools import cached_property
from typing import Any

import torch
from torch import nn
from torch.export import ExportedProgram

from pytest_ptn.comparison import reduced_precision
from pytest_ptn.programs.exported import constants_of, functionalize, mutable_keys
from pytest_ptn.reference.planner import StateConflictError, shared_state

Entry = nn.Module | Callable[..., Any] | ExportedProgram
Source = nn.Module | Mapping[str, Entry]


class ProgramFormError(ValueError):
    """A program that is none of the forms a program is given in, or whose methods are not its inputs'."""


class Function(nn.Module):
    """A plain callable as a forward: tensors it closes over are exported as constants."""

    def __init__(self, function: Callable[..., Any]):
        super().__init__()
        self.function = function

    def forward(self, *args: Any) -> Any:
        return self.function(*args)


def method_view(model: nn.Module, method: str) -> nn.Module:
    """A shallow copy of ``model`` whose forward is ``model.<method>``: the same parameters and buffers under
    the same FQNs, so every method's export names one tensor alike."""
    view = copy.copy(model)
    view.forward = getattr(model, method)
    return view


class UserProgram:
    """Fresh exports of the user's program and eager runs of it, each from a new inference copy.

    ``inputs`` gives each method's example inputs, used to export it. ``offset`` is added to every
    floating-point parameter and buffer (and an ExportedProgram's constants): the same names holding other
    values, S4's second program."""

    def __init__(self, source: Source, inputs: Mapping[str, tuple[Any, ...]], offset: float = 0.0):
        _check_form(source, inputs)
        self.source = source
        self.inputs = dict(inputs)
        self.offset = offset
        self._inspected: dict[str, ExportedProgram] | None = None

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(self.inputs)

    def export(self) -> dict[str, ExportedProgram]:
        """New ExportedPrograms (a lowering may consume them), one per method, from one fresh copy."""
        return {
            name: entry
            if isinstance(entry, ExportedProgram)
            else torch.export.export(entry, self.inputs[name], strict=False)
            for name, entry in self._fresh().items()
        }

    def inspected(self) -> dict[str, ExportedProgram]:
        """Functional programs to read constants and mutations from (computed once: read-only)."""
        if self._inspected is None:
            self._inspected = functionalize(self.export())
        return self._inspected

    @cached_property
    def conflict(self) -> StateConflictError | None:
        """P7: a mutable key whose dtype, shape or initial bytes differ between the methods binding it
        (methods built separately, each with its own buffer of that name): a program the rules reject."""
        try:
            shared_state({m: constants_of(ep) for m, ep in self.inspected().items()})
        except StateConflictError as e:
            return e
        return None

    def eager(self, widen: torch.dtype | None = None) -> dict[str, nn.Module]:
        """The methods as modules on one fresh copy, state carried between calls as eager does; a tensor is
        found in them by the key the exported programs give it (find_tensor). An ExportedProgram runs as
        ``ep.module()``. A buffer some method mutates is one tensor across methods, as the rules define the
        program (one ``state/k``), also where methods were built separately; StateConflictError if their
        initial values differ (see conflict). ``widen``: every floating parameter and buffer converted to
        that dtype (the same values, exactly), to measure eager's own rounding (pytest_ptn.comparison)."""
        conflict = self.conflict
        if conflict is not None:
            raise StateConflictError(str(conflict), conflict.methods, conflict.keys)
        modules = {
            name: entry.module(check_guards=False) if isinstance(entry, ExportedProgram) else entry
            for name, entry in self._fresh().items()
        }
        if widen is not None:
            for module in modules.values():
                module.to(widen)
                widen_graphs(module, widen)
        tie_state(modules, mutable_keys(self.inspected()))
        return modules

    def wide_eager(self) -> dict[str, nn.Module] | None:
        """A fresh eager copy widened to float64 for a reduced-precision program (to bound its rounding,
        pytest_ptn.comparison), None for one in float32 or wider."""
        return self.eager(torch.float64) if self.reduced_precision else None

    @cached_property
    def reduced_precision(self) -> bool:
        """Whether the program holds or takes a floating tensor coarser than float32 (a bf16 model): then
        its eager results are compared with a float64 run's too."""
        tensors = [a for args in self.inputs.values() for a in args]
        for ep in self.inspected().values():
            tensors += [*ep.state_dict.values(), *ep.constants.values()]
        return any(isinstance(t, torch.Tensor) and reduced_precision(t) for t in tensors)

    def _fresh(self) -> dict[str, nn.Module | ExportedProgram]:
        """method -> the module whose forward runs it, or its ExportedProgram, all on one new inference copy
        (modules shared between entries stay shared)."""
        source = copy.deepcopy(self.source)
        if isinstance(source, nn.Module):
            runs: dict[str, nn.Module | ExportedProgram] = {n: method_view(source, n) for n in self.inputs}
            roots = [source]
        else:
            runs = {name: _runnable(source[name]) for name in self.inputs}
            roots = [r for r in map(_module_of, source.values()) if r is not None]
        for root in roots:
            root.eval()  # lowered for inference: no dropout, batch-norm running statistics
        tensors: list[object] = [t for root in roots for t in [*root.parameters(), *root.buffers()]]
        for ep in runs.values():
            if isinstance(ep, ExportedProgram):
                tensors += [*ep.state_dict.values(), *ep.constants.values()]
        self._for_inference(tensors)
        return runs

    def _for_inference(self, tensors: Iterable[object]) -> None:
        unique = {id(t): t for t in tensors if isinstance(t, torch.Tensor)}
        with torch.no_grad():
            for t in unique.values():
                t.requires_grad_(False)
                if self.offset and t.is_floating_point():
                    t.add_(self.offset)


def _check_form(source: Source, inputs: Mapping[str, tuple[Any, ...]]) -> None:
    if isinstance(source, nn.Module):
        missing = [m for m in inputs if not callable(getattr(source, m, None))]
        if missing:
            raise ProgramFormError(f"the model has no method {', '.join(missing)}")
    elif isinstance(source, Mapping):
        if set(source) != set(inputs):
            raise ProgramFormError(f"methods {sorted(source)} but inputs for {sorted(inputs)}")
        wrong = [m for m, e in source.items() if not isinstance(e, ExportedProgram) and not callable(e)]
        if wrong:
            raise ProgramFormError(f"method {wrong[0]!r} is {type(source[wrong[0]]).__name__}")
    else:
        raise ProgramFormError(
            f"a program is an nn.Module or a mapping of method name -> module, callable or ExportedProgram, "
            f"not {type(source).__name__}"
        )


def _module_of(entry: Entry) -> nn.Module | None:
    """The module an entry's tensors belong to: itself, or the owner of a bound method."""
    owner = entry if isinstance(entry, nn.Module) else getattr(entry, "__self__", None)
    return owner if isinstance(owner, nn.Module) else None


def _runnable(entry: Entry) -> nn.Module | ExportedProgram:
    """A mapping's entry as a module to export and run (keeping a bound method's owner's FQNs), or as is."""
    if isinstance(entry, nn.Module | ExportedProgram):
        return entry
    owner = getattr(entry, "__self__", None)
    if isinstance(owner, nn.Module):
        return method_view(owner, entry.__name__)
    return Function(entry)


def widen_graphs(module: nn.Module, dtype: torch.dtype) -> None:
    """The graphs of an exported method (``ep.module()`` and its branches) made to compute in ``dtype`` as
    ``module.to(dtype)`` makes its tensors: every floating dtype a node names (``x.to(torch.bfloat16)``,
    ``torch.arange(..., dtype=...)``) becomes ``dtype``, and the metadata assertions torch.export writes for
    an explicit dtype (``_assert_tensor_metadata``, which would refuse the wider tensor) are dropped. An
    ``nn.Module``'s own Python code is left as it is: its casts round the wide run where they stand."""
    assert_metadata = torch.ops.aten._assert_tensor_metadata.default
    for graph_module in module.modules():
        if not isinstance(graph_module, torch.fx.GraphModule):
            continue
        for node in list(graph_module.graph.nodes):
            if node.op != "call_function":
                continue
            if node.target is assert_metadata:
                graph_module.graph.erase_node(node)
                continue
            node.args = tuple(_widened_dtype(a, dtype) for a in node.args)
            node.kwargs = {k: _widened_dtype(v, dtype) for k, v in node.kwargs.items()}
        graph_module.recompile()


def _widened_dtype(value: Any, dtype: torch.dtype) -> Any:
    return dtype if isinstance(value, torch.dtype) and value.is_floating_point else value


def widened(args: tuple[Any, ...], dtype: torch.dtype) -> tuple[Any, ...]:
    """``args`` with every floating tensor converted to ``dtype`` (a copy)."""
    return tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def exported_eager(programs: Mapping[str, ExportedProgram], mutable: set[str]) -> dict[str, nn.Module]:
    """``ep.module()`` of each program, the buffers in ``mutable`` one tensor per name across methods."""
    modules: dict[str, nn.Module] = {name: ep.module(check_guards=False) for name, ep in programs.items()}
    tie_state(modules, mutable)
    return modules


def tie_state(modules: Mapping[str, nn.Module], mutable: set[str]) -> None:
    """Bind every buffer named in ``mutable`` to one tensor across ``modules`` (the first module's)."""
    state: dict[str, torch.Tensor] = {}
    for module in modules.values():
        for key, tensor in list(module.named_buffers()):
            if key in mutable:
                set_tensor(module, key, state.setdefault(key, tensor))


def set_tensor(module: nn.Module, key: str, tensor: torch.Tensor) -> None:
    """Bind ``tensor`` at the dotted ``key`` of ``module`` (a parameter, buffer or plain attribute)."""
    path, _, leaf = key.rpartition(".")
    owner = module.get_submodule(path)
    if isinstance(getattr(owner, leaf, None), nn.Parameter):
        tensor = nn.Parameter(tensor, requires_grad=False)
    setattr(owner, leaf, tensor)


def find_tensor(modules: Mapping[str, nn.Module], key: str) -> torch.Tensor | None:
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
