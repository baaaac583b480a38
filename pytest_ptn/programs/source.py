"""A user's multi-method program in any form upstream lowers from, as fresh exports and eager modules.

A program is one ``nn.Module`` whose methods are named, or a mapping of method name -> ``nn.Module`` (its
forward), callable or ``ExportedProgram`` (methods built or exported separately), where a value that is none
of those (an int, a string, ...) is a constant method, as ExecuTorch's ``constant_methods`` ship them
(optimum-executorch's ``get_max_seq_len``). Both doors take it: ``pytest_ptn.check.check_program`` and the
``pytest_ptn_programs`` hook's ``NamedProgram``. Every export and eager run starts from a new deep copy of it
(a plain function is not copied), made for inference: modules in eval mode, no tensor requiring grad or
carrying autograd history, as when a model is lowered for deployment. Tensors keep the user's own names
(FQNs): a method of one module is exported from a shallow copy of that module whose forward is the method,
so every method names one tensor alike.

A method's inputs are given positionally (a tuple), as keywords (a mapping), or both as ``(args, kwargs)``,
the form of ``ExportedProgram.example_inputs``; the lowered method takes them flat, in its exported
program's input order (its ``in_spec``), as a runtime does, and the eager modules take them that way too.
"""

from __future__ import annotations

import copy
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cached_property
from typing import Any

import torch
from torch import nn
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from pytest_ptn.instruments.comparison import reduced_precision
from pytest_ptn.programs.exported import constants_of, functionalize, mutable_keys, specs_kept
from pytest_ptn.reference.planner import StateConflictError, shared_state

Entry = nn.Module | Callable[..., Any] | ExportedProgram
Source = nn.Module | Mapping[str, Any]
"""An ``nn.Module``, or a mapping of method name -> Entry or constant method value (CONSTANT_TYPES)."""
Inputs = tuple[Any, ...] | Mapping[str, Any]
"""A method's inputs: positional, keywords, or ``(args, kwargs)`` (``ExportedProgram.example_inputs``)."""

CONSTANT_TYPES = (bool, int, float, str, list, tuple, torch.Tensor)
"""What a constant method of an ExecuTorch program returns (``to_edge(constant_methods=...)``): a value, no
inputs, no program to lower; every rule is about programs, so none applies to one."""


class ProgramFormError(ValueError):
    """A program that is none of the forms a program is given in, or whose methods are not its inputs'."""


class Function(nn.Module):
    """A plain callable as a forward: tensors it closes over are exported as constants."""

    def __init__(self, function: Callable[..., Any]):
        super().__init__()
        self.function = function

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)


def arguments(given: Inputs) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` of inputs given positionally, as keywords, or as both."""
    if isinstance(given, Mapping):
        return (), dict(given)
    if isinstance(given, tuple):
        if len(given) == 2 and isinstance(given[0], tuple) and isinstance(given[1], Mapping):
            return given[0], dict(given[1])
        return given, {}
    raise ProgramFormError(
        f"a method's inputs are a tuple, a mapping of keywords or (args, kwargs), not {type(given).__name__}"
    )


def leaves(given: Inputs) -> list[Any]:
    """Every value of a method's inputs, in order."""
    return pytree.tree_leaves(arguments(given))


def flat(method: str, given: Inputs, in_spec: pytree.TreeSpec | None) -> tuple[Any, ...]:
    """``given`` as the lowered method takes it: flat, in its exported program's input order (``in_spec``:
    keywords in the order the program declares them), each tensor without autograd history. Inputs that are
    flat already (a tuple of every input the program takes, as a runtime takes them) stay as they are.
    ProgramFormError for inputs of another structure (a missing or unknown keyword, a count that fits no
    form)."""
    args, kwargs = arguments(given)
    keywords = _keywords(in_spec)
    if set(kwargs) == set(keywords):
        values, spec = pytree.tree_flatten((args, {k: kwargs[k] for k in keywords}))
        if in_spec is None or spec == in_spec:
            return _detached(values)
    if in_spec is not None and not kwargs and len(args) == in_spec.num_leaves:
        return _detached(args)
    positional = in_spec.child(0).num_children if in_spec is not None else len(args)
    raise ProgramFormError(
        f"method {method!r} takes {positional} positional inputs and keywords {keywords}, not "
        f"{len(args)} positional and keywords {list(kwargs)}"
    )


def _keywords(in_spec: pytree.TreeSpec | None) -> list[str]:
    """The keyword inputs a program declares, in its order."""
    if in_spec is None or in_spec.type is not tuple or in_spec.num_children != 2:
        return []
    return list(in_spec.child(1).context or [])


def _is_positional(in_spec: pytree.TreeSpec) -> bool:
    """Whether a program's inputs are positional values only: then its flat inputs are its arguments."""
    if in_spec.type is not tuple or in_spec.num_children != 2:
        return False
    count = in_spec.child(0).num_children
    return in_spec == pytree.tree_flatten((tuple(range(count)), {}))[1]


def copied(value: Any) -> Any:
    """A call's argument or result as a copy of its own, without autograd history: a backend may write into
    its inputs, and a runtime may reuse the memory of its outputs."""
    return value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)


def _detached(values: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(v.detach() if isinstance(v, torch.Tensor) and v.grad_fn is not None else v for v in values)


def taking_flat_inputs(module: nn.Module, in_spec: pytree.TreeSpec | None) -> nn.Module:
    """``module`` called with its inputs flat, as the lowered method is (see ``flat``): itself for a method
    of positional inputs, else a view of it (its very tensors under its FQNs, its own hooks) that rebuilds
    ``(args, kwargs)`` by ``in_spec`` before anything else sees them (an ``ep.module()`` checks its inputs
    against that spec). A view, not ``copy.copy``: a GraphModule's copy is a new module with other tensors."""
    if in_spec is None or _is_positional(in_spec):
        return module
    spec = in_spec

    def structured(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return None if kwargs else pytree.tree_unflatten(list(args), spec)

    view = object.__new__(type(module))
    view.__dict__.update(module.__dict__)
    view._forward_pre_hooks = OrderedDict(module._forward_pre_hooks)
    view._forward_pre_hooks_with_kwargs = OrderedDict(module._forward_pre_hooks_with_kwargs)
    view.register_forward_pre_hook(structured, with_kwargs=True, prepend=True)
    return view


def method_view(model: nn.Module, method: str) -> nn.Module:
    """A shallow copy of ``model`` whose forward is ``model.<method>``: the same parameters and buffers under
    the same FQNs, so every method's export names one tensor alike."""
    view = copy.copy(model)
    view.forward = getattr(model, method)
    return view


class UserProgram:
    """Fresh exports of the user's program and eager runs of it, each from a new inference copy.

    ``inputs`` gives each method's example inputs (Inputs), used to export it; a constant method needs none
    (``constants``: its value; it is neither exported nor run). ``offset`` is added to every floating-point
    parameter and buffer (and an ExportedProgram's constants): the same names holding other values, S4's
    second program."""

    def __init__(self, source: Source, inputs: Mapping[str, Inputs], offset: float = 0.0):
        self.constants = _check_form(source, inputs)
        self.source = source
        self.inputs = {name: given for name, given in inputs.items() if name not in self.constants}
        self.offset = offset
        self._inspected: dict[str, ExportedProgram] | None = None

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods that are programs (constant methods aside), in the order given."""
        return tuple(self.inputs)

    def export(self) -> dict[str, ExportedProgram]:
        """New ExportedPrograms (a lowering may consume them), one per method, from one fresh copy."""
        return {name: self._exported(name, entry) for name, entry in self._fresh().items()}

    def _exported(self, name: str, entry: nn.Module | ExportedProgram) -> ExportedProgram:
        """``entry`` exported for method ``name``; an error its code raises comes through as it is, with a
        note naming the method (a module per method shows every method's code as ``forward``)."""
        if isinstance(entry, ExportedProgram):
            return entry
        try:
            return torch.export.export(entry, *arguments(self.inputs[name]), strict=False)
        except Exception as e:
            if sys.version_info >= (3, 11):
                e.add_note(f"pytest-ptn: raised while exporting method {name!r} (torch.export.export)")
            raise

    def inspected(self) -> dict[str, ExportedProgram]:
        """Functional programs to read constants and mutations from (computed once: read-only)."""
        if self._inspected is None:
            self._inspected = functionalize(self.export())
        return self._inspected

    def buffer_fqns(self) -> dict[str, torch.Tensor]:
        """Initial value of every buffer of the program, written or only read, by each FQN export gives it."""
        return buffers_by_fqn(self.eager().values())

    def state_fqns(self) -> dict[str, torch.Tensor]:
        """Initial value of every buffer some method writes, by the FQN export gives it."""
        return written_state(self, self.eager())

    def flat(self, method: str, given: Inputs) -> tuple[Any, ...]:
        """``given`` flat, in the order the lowered method (and ``eager()``'s module of it) takes it, without
        autograd history; ProgramFormError if the method takes inputs of another structure."""
        return flat(method, given, self.inspected()[method].call_spec.in_spec)

    def calls(self, sequence: Iterable[tuple[str, Inputs]]) -> list[tuple[str, tuple[Any, ...]]]:
        """A call sequence with each call's inputs flat (``flat``); calls of constant methods left out (no
        program runs them). ProgramFormError for a call to a method the program does not have."""
        out = []
        for i, (name, given) in enumerate(sequence):
            if name in self.constants:
                continue
            if name not in self.inputs:
                raise ProgramFormError(
                    f"call #{i} is to {name!r}, which is not one of the methods {list(self.inputs)}"
                )
            out.append((name, self.flat(name, given)))
        return out

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
        """The methods as modules on one fresh copy, state carried between calls as eager does, each called
        with its inputs flat (``flat``); a tensor is found in them by the key the exported programs give it
        (find_tensor). An ExportedProgram runs as ``ep.module()``. A buffer some method mutates is one tensor
        across methods, as the rules define the program (one ``state/k``), also where methods were built
        separately; StateConflictError if their initial values differ (see conflict). ``widen``: every
        floating parameter and buffer converted to that dtype (the same values, exactly), to measure eager's
        own rounding (pytest_ptn.instruments.comparison)."""
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
        inspected = self.inspected()
        tie_state(modules, mutable_keys(inspected))
        return {name: taking_flat_inputs(m, inspected[name].call_spec.in_spec) for name, m in modules.items()}

    def wide_eager(self) -> dict[str, nn.Module] | None:
        """A fresh eager copy widened to float64 for a reduced-precision program (to bound its rounding,
        pytest_ptn.instruments.comparison), None for one in float32 or wider."""
        return self.eager(torch.float64) if self.reduced_precision else None

    @cached_property
    def reduced_precision(self) -> bool:
        """Whether the program holds or takes a floating tensor coarser than float32 (a bf16 model): then
        its eager results are compared with a float64 run's too."""
        tensors = [a for given in self.inputs.values() for a in leaves(given)]
        for ep in self.inspected().values():
            tensors += [*ep.state_dict.values(), *ep.constants.values()]
        return any(isinstance(t, torch.Tensor) and reduced_precision(t) for t in tensors)

    def _fresh(self) -> dict[str, nn.Module | ExportedProgram]:
        """method -> the module whose forward runs it, or its ExportedProgram, all on one new inference copy
        (modules shared between entries stay shared)."""
        source = copy.deepcopy(self.source, _copy_memo(self.source))
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


def _copy_memo(source: Source) -> dict[int, Any]:
    """A deep-copy memo for ``source``: each tensor with autograd history it holds (on its modules, in an
    ExportedProgram's example inputs, state and constants: optimum-executorch's example decoder inputs are an
    encoder's output computed with grad on) copied detached, since torch refuses to deep-copy a tensor that
    is not a graph leaf and nothing lowered for inference needs that history; an ExportedProgram's pytree
    specs kept (call_graph_copy: copying one warns from our code)."""
    entries = list(source.values()) if isinstance(source, Mapping) else [source]
    found: list[object] = []
    memo: dict[int, Any] = {}
    for entry in entries:
        if isinstance(entry, ExportedProgram):
            memo.update(specs_kept(entry.module_call_graph))
            found += pytree.tree_leaves(entry.example_inputs)
            found += [*entry.state_dict.values(), *entry.constants.values()]
            entry = entry.graph_module
        module = _module_of(entry)
        if module is not None:
            found += [v for m in module.modules() for v in [*vars(m).values(), *m.buffers(recurse=False)]]
        found.append(entry)
    for t in found:
        if isinstance(t, torch.Tensor) and t.grad_fn is not None:
            memo[id(t)] = t.detach().clone()
    return memo


def _check_form(source: Source, inputs: Mapping[str, Inputs]) -> dict[str, Any]:
    """The program's constant methods (name -> value), after checking that it is in one of the forms a
    program is given in and that ``inputs`` names its methods, each in an Inputs form."""
    for given in inputs.values():
        arguments(given)
    if isinstance(source, nn.Module):
        missing = [m for m in inputs if not callable(getattr(source, m, None))]
        if missing:
            raise ProgramFormError(f"the model has no method {', '.join(missing)}")
        return {}
    if not isinstance(source, Mapping):
        raise ProgramFormError(
            f"a program is an nn.Module or a mapping of method name -> module, callable, ExportedProgram or "
            f"constant value, not {type(source).__name__}"
        )
    constants = {m: v for m, v in source.items() if isinstance(v, CONSTANT_TYPES)}
    wrong = [
        m
        for m, e in source.items()
        if m not in constants and not isinstance(e, ExportedProgram) and not callable(e)
    ]
    if wrong:
        raise ProgramFormError(f"method {wrong[0]!r} is {type(source[wrong[0]]).__name__}")
    programs = set(source) - set(constants)
    if not programs <= set(inputs) <= set(source):
        raise ProgramFormError(f"methods {sorted(programs)} but inputs for {sorted(inputs)}")
    taking = [m for m in constants if m in inputs and leaves(inputs[m])]
    if taking:
        raise ProgramFormError(f"constant method {taking[0]!r} takes no inputs")
    return constants


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


def written_state(program: UserProgram, methods: dict[str, nn.Module]) -> dict[str, torch.Tensor]:
    """Every buffer some method writes, as ``methods`` hold it now, by the FQN export gives it."""
    found = {key: find_tensor(methods, key) for key in sorted(mutable_keys(program.inspected()))}
    return {key: t.clone() for key, t in found.items() if t is not None}


def buffers_by_fqn(modules: Iterable[nn.Module]) -> dict[str, torch.Tensor]:
    """A copy of every buffer of ``modules`` (one program's methods), by each FQN export gives it."""
    out: dict[str, torch.Tensor] = {}
    for module in modules:
        for key, t in module.named_buffers(remove_duplicate=False):
            out.setdefault(key, t.clone())
    return out
