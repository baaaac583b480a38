"""Turn a ProgramSpec into real multi-method torch modules, fresh exports and eager expectations.

Every call of ``export`` builds new modules: ExecuTorch's ``to_native`` empties ``ep.constants`` of the
programs it lowers, so an ExportedProgram is good for one lowering only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from pytest_ptn.backend import EagerCall
from pytest_ptn.instruments.comparison import reduced_precision
from pytest_ptn.programs.export_forms import EXPORT_FORMS
from pytest_ptn.programs.source import buffers_by_fqn
from pytest_ptn.spec import SHARED, TENSOR_FAMILIES, VIEW_LAYOUTS, Constant, Method, ProgramSpec


def make_tensor(c: Constant) -> torch.Tensor:
    """The deterministic values of a constant, contiguous: its ``values``, else drawn from its ``seed``, in
    ``drawn_as`` and read as its dtype where given, in transposed order where ``reordered``, its ``moved``
    elements nudged. A tied constant has none of its own (``tensors`` gives it its source's)."""
    if c.tied is not None:
        raise ValueError(f"constant {c.name!r} is tied to {c.tied!r}: its values are that tensor's")
    dtype = getattr(torch, c.dtype)
    drawn = _drawn(c, getattr(torch, c.drawn_as or c.dtype))
    t = drawn.view(dtype) if drawn.dtype != dtype else drawn
    if c.reordered:
        t = t.transpose(-2, -1).contiguous()
    moved = c.moved
    if not moved:
        return t
    flat = t.reshape(-1).clone()
    at = torch.tensor(moved, dtype=torch.long)
    x = flat[at]
    if dtype.is_floating_point:
        wide = x.double()
        shifted = (wide + c.nudge * wide.abs().clamp(min=1.0)).to(dtype)
        up = torch.nextafter(x, torch.full_like(x, float("inf")))
        flat[at] = torch.where(shifted == x, up, shifted)  # at least the dtype's next value up
    elif dtype == torch.bool:
        flat[at] = ~x
    else:
        flat[at] = x + 1
    return flat.reshape(c.shape)


def held(c: Constant, value: torch.Tensor) -> torch.Tensor:
    """``value`` laid out in memory as ``c.layout`` says (spec.LAYOUTS): the same values, other strides or
    a storage holding other values beside them (each of value's elements plus one)."""
    if c.layout == "transposed":
        return value.transpose(-2, -1).contiguous().transpose(-2, -1)
    if c.layout not in VIEW_LAYOUTS:
        return value
    beside = ~value if value.dtype == torch.bool else value + 1
    if c.layout == "strided":
        storage = torch.stack((value, beside), -1).reshape(*value.shape[:-1], 2 * value.shape[-1])
        return storage[..., ::2]
    storage = torch.cat((beside.reshape(-1), value.reshape(-1)))
    return storage[value.numel() :].view(value.shape)


def tensors(constants: tuple[Constant, ...]) -> dict[str, torch.Tensor]:
    """The tensor of each of one owner's tensor constants (spec.TENSOR_FAMILIES), as the module holds it:
    laid out as its layout says, a tied one the very storage of its source (transposed where it says so)."""
    out = {
        c.name: held(c, make_tensor(c)) for c in constants if c.family in TENSOR_FAMILIES and c.tied is None
    }
    for c in constants:
        if c.tied is not None:
            source = out[c.tied]
            out[c.name] = source.transpose(-2, -1) if c.layout == "transposed" else source
    return out


def values(constants: tuple[Constant, ...], c: Constant) -> torch.Tensor:
    """``c``'s values (contiguous), among the constants of its owner: a tied one's from its source."""
    if c.tied is None:
        return make_tensor(c)
    source = next(s for s in constants if s.name == c.tied)
    value = make_tensor(source)
    return value.transpose(-2, -1).contiguous() if c.layout == "transposed" else value


def _drawn(c: Constant, dtype: torch.dtype) -> torch.Tensor:
    if c.values is not None:
        return torch.tensor(c.values, dtype=torch.float64).to(dtype).reshape(c.shape)
    g = torch.Generator().manual_seed(c.seed)
    if dtype.is_floating_point:
        return torch.randn(c.shape, generator=g, dtype=torch.float64).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, c.shape, generator=g).to(dtype)
    return torch.randint(-100, 100, c.shape, generator=g).to(dtype)


def weighted_sum(t: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Position-weighted sum in ``dtype`` (the program's): any change of a tensor's bytes, or order, changes
    it."""
    flat = t.to(dtype).reshape(-1)
    return (flat * torch.arange(1, flat.numel() + 1, dtype=dtype)).sum()


def _register(module: nn.Module, c: Constant, value: torch.Tensor | None = None) -> None:
    """Give ``module`` constant ``c`` at its path (submodules made as needed); ``value`` is its tensor as
    ``tensors`` holds it (a parameter of a tied pair stays one Parameter under both names)."""
    owner, leaf = _owner(module, c.name, create=True)
    if c.family in TENSOR_FAMILIES:
        assert value is not None
        if c.family == "parameter":
            param = value if isinstance(value, nn.Parameter) else nn.Parameter(value, requires_grad=False)
            owner.register_parameter(leaf, param)
        elif c.family == "buffer":
            owner.register_buffer(leaf, value, persistent=c.persistent)
        else:
            object.__setattr__(owner, leaf, value)
        return
    if c.family == "int8_linear":
        linear = nn.Linear(c.shape[1], c.shape[0], bias=False)
        linear.weight.data = make_tensor(c).to(torch.float32)
        owner.add_module(leaf, linear)
    elif c.family == "linear":
        linear = nn.Linear(c.shape[1], c.shape[0], dtype=getattr(torch, c.dtype)).requires_grad_(False)
        linear.weight.copy_(make_tensor(c))
        linear.bias.copy_(make_tensor(replace(c, shape=c.shape[:1], seed=c.seed + 1)))
        owner.add_module(leaf, linear)


def _register_all(module: nn.Module, constants: tuple[Constant, ...]) -> None:
    held_as = tensors(constants)
    params: dict[str, nn.Parameter] = {}
    for c in sorted(constants, key=lambda c: c.tied is not None):  # a tie's source first
        value = held_as.get(c.name)
        if c.family == "parameter" and value is not None:
            source = params.get(c.tied) if c.tied is not None and c.layout != "transposed" else None
            value = params[c.name] = (
                source if source is not None else nn.Parameter(value, requires_grad=False)
            )
        _register(module, c, value)


def _owner(module: nn.Module, name: str, create: bool = False) -> tuple[nn.Module, str]:
    """The submodule holding the last part of path ``name``, and that part (``layers.0`` and ``weight``)."""
    *path, leaf = name.split(".")
    owner = module
    for part in path:
        child = owner._modules.get(part)
        if child is None:
            if not create:
                raise AttributeError(f"{type(module).__name__} has no submodule {part!r} of {name!r}")
            child = nn.Module()
            owner.add_module(part, child)
        owner = child
    return owner, leaf


def at_path(module: nn.Module, name: str) -> Any:
    """What ``module`` holds at the dotted path ``name`` (a tensor, or a linear layer)."""
    owner, leaf = _owner(module, name)
    return getattr(owner, leaf)


def _quantize(module: nn.Module, constants: tuple[Constant, ...]) -> None:
    """torchao int8 weight-only quantization of the module's own ``int8_linear`` children."""
    names = {c.name for c in constants if c.family == "int8_linear"}
    if names:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        quantize_(module, Int8WeightOnlyConfig(), filter_fn=lambda m, fqn: fqn in names)


class SharedConstants(nn.Module):
    """The root every method module holds as ``shared``: one object, so one FQN and one tensor."""

    def __init__(self, spec: ProgramSpec):
        super().__init__()
        _register_all(self, spec.shared)
        _quantize(self, spec.shared)


class MethodModule(nn.Module):
    """One method of the program, as the module that gets exported for it."""

    def __init__(self, spec: ProgramSpec, method: Method, shared: SharedConstants):
        super().__init__()
        self.spec_method = method
        self.vectors = spec.vectors
        self.shared = shared
        if spec.shared_alias is not None:
            setattr(self, spec.shared_alias, shared)  # one module, a second path: every tensor gets two FQNs
        self._specs = {c.name: c for c in spec.shared} | {c.name: c for c in method.constants}
        self._private = {c.name for c in method.constants}
        # Values of literals and scalars are computed here: a tensor made in forward would itself be exported.
        # Only theirs: every other family is registered as a tensor, and listing it cost a Python float per
        # element of every weight, for every method module built.
        self._values = {
            c.name: make_tensor(c).tolist() for c in self._specs.values() if c.family in ("literal", "scalar")
        }
        _register_all(self, method.constants)
        _quantize(self, method.constants)
        if method.branch is not None:
            _register_all(self, (method.branch.on_true, method.branch.on_false))

    def _tensor(self, name: str, x: torch.Tensor) -> torch.Tensor:
        c = self._specs[name]
        if c.family == "literal":
            return torch.tensor(self._values[name], dtype=getattr(torch, c.dtype))
        if c.family == "scalar":
            value = self._values[name]
            assert isinstance(value, float)
            return x.sum() + value
        owner: nn.Module = self if name in self._private else self.shared
        if c.family in ("int8_linear", "linear"):
            return at_path(owner, name)(x)
        return at_path(owner, name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._vectors(x) if self.vectors else self._sums(x)

    def _vectors(self, x: torch.Tensor) -> torch.Tensor:
        """A program of ``vectors`` (spec.ProgramSpec): ``x`` is one row; no 0-d tensor is ever made."""
        for w in self.spec_method.writes:  # shift, the only write of such a program
            buf = self._tensor(w.target, x)
            buf.copy_(torch.cat((buf[1:], x.to(buf.dtype)), 0))
        terms = []
        for name in self.spec_method.reads:
            t = self._tensor(name, x)
            terms.append(t.reshape(-1) if self._specs[name].family == "linear" else (t * x).sum(-1))
        return torch.cat(terms) if terms else x.reshape(-1)

    def _sums(self, x: torch.Tensor) -> torch.Tensor:
        m = self.spec_method
        if m.mutates_input:
            x.add_(1.0)
        xs = x.sum()
        for w in m.writes:
            buf = self._tensor(w.target, x)
            if w.op == "add":
                buf.add_(xs.to(buf.dtype))
            elif w.op == "copy":
                buf.copy_(xs.expand(buf.shape))
            else:
                row = (torch.argmax(x) % buf.shape[0]).reshape(1)
                buf.index_copy_(0, row, x.reshape(1, -1).to(buf.dtype))
        terms = [weighted_sum(self._tensor(name, x), x.dtype) + xs for name in m.reads]
        if m.branch is not None:
            true_t = at_path(self, m.branch.on_true.name)
            false_t = at_path(self, m.branch.on_false.name)

            def on_true(v: torch.Tensor) -> torch.Tensor:
                return v + true_t

            def on_false(v: torch.Tensor) -> torch.Tensor:
                return v - false_t

            terms.append(weighted_sum(torch.cond(xs > 0, on_true, on_false, (x,)), x.dtype))
        if not terms:
            terms.append(xs)
        return torch.stack(terms)


_TRACED_VALUES = ("literal", "scalar")
"""Families whose values are in the exported graph (a scalar's float) or minted by export from them."""


_CHILD_MODULES = ("int8_linear", "linear")
"""Families registered as a child module, whose tensors' FQNs are the child's (``<name>.weight``)."""


def export_key(spec: ProgramSpec, method: Method) -> tuple[str | None, tuple[str, ...]]:
    """What ``method``'s export depends on besides its constants' names and tensor values, and the FQN of
    each constant by position (programs.export_forms): the root's constants and the method's own by family,
    dtype, shape, persistence, layout and tie (a literal's or scalar's values too), what it reads and writes
    by position, its input and the root's second path. None for a method torch may export differently under
    other names (a branch's subgraphs) or that holds a tensor on a child module (a linear layer's weight)."""
    own = method.constants
    if method.branch is not None or any(c.family in _CHILD_MODULES for c in (*spec.shared, *own)):
        return None, ()
    roots = (SHARED, *((spec.shared_alias,) if spec.shared_alias is not None else ()))
    registered = [(f"{root}.{c.name}", (SHARED, c)) for root in roots for c in _registered(spec.shared)]
    registered += [(c.name, ("", c)) for c in _registered(own)]
    walked = [registered[i] for i in _walk([path.split(".") for path, _ in registered])]
    position = {(owner, c.name): i for i, (_, (owner, c)) in enumerate(walked)}
    traced = [c for c in own if c.family in _TRACED_VALUES]
    position |= {("", c.name): len(walked) + i for i, c in enumerate(traced)}

    def at(name: str) -> int:
        return position[("", name)] if method.private(name) else position[(SHARED, name)]

    def slot(owner: str, c: Constant) -> tuple[object, ...]:
        values = (c.values, c.seed) if c.family in _TRACED_VALUES else ()
        tie = position[(owner, c.tied)] if c.tied is not None else None
        return (c.family, c.dtype, c.shape, c.persistent, values, c.layout, tie)

    key = (
        spec.dtype,
        spec.vectors,
        len(roots),
        tuple(slot(owner, c) for _, (owner, c) in walked),
        tuple(slot("", c) for c in traced),
        tuple(map(at, method.reads)),
        tuple((at(w.target), w.op) for w in method.writes),
        method.input_shape,
        method.mutates_input,
    )
    return repr(key), tuple(fqn for fqn, _ in walked)


def _registered(constants: tuple[Constant, ...]) -> list[Constant]:
    """One owner's module tensors in the order its module registers them: a tied one after the rest."""
    return sorted((c for c in constants if c.family not in _TRACED_VALUES), key=lambda c: c.tied is not None)


def _walk(paths: list[list[str]], at: int = 0) -> list[int]:
    """The indices of ``paths`` (the parts of dotted paths from one module, from part ``at`` on, in the order
    their tensors were registered, each submodule made at its first path) in the order torch lists a
    module's tensors (``named_parameters``, ``named_buffers``): the module's own first, then each
    submodule's, as made. A method module makes its root submodule (``shared``) before its own, so: its own
    top-level tensors, the root's, then its own submodules'. Two methods whose walks hold the same slots in
    the same order list them alike, whatever their paths, and share one export form."""
    own = [i for i, parts in enumerate(paths) if len(parts) == at + 1]
    submodules: dict[str, list[int]] = {}
    for i, parts in enumerate(paths):
        if len(parts) > at + 1:
            submodules.setdefault(parts[at], []).append(i)
    out = own
    for indices in submodules.values():
        inner = _walk([paths[i] for i in indices], at + 1)
        out = [*out, *(indices[j] for j in inner)]
    return out


class Program:
    """A built ProgramSpec: fresh modules and exports on demand, eager results computed once."""

    def __init__(self, spec: ProgramSpec):
        self.spec = spec
        self._eager: list[EagerCall] | None = None

    @property
    def method_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.spec.methods)

    def with_other_values(self) -> Program:
        """The same program (names, shapes, calls) holding other tensors: a second program for S4."""
        return Program(self.spec.with_other_values())

    def modules(self) -> dict[str, MethodModule]:
        shared = SharedConstants(self.spec)
        return {m.name: MethodModule(self.spec, m, shared).eval() for m in self.spec.methods}

    def example_inputs(self, method: str, call_index: int = 0) -> tuple[torch.Tensor, ...]:
        shape = self.spec.method(method).input_shape
        g = torch.Generator().manual_seed(self.spec.seed * 7919 + call_index)
        return (torch.randn(shape, generator=g).to(getattr(torch, self.spec.dtype)),)

    def export(
        self, methods: Callable[[str], bool] = lambda name: True
    ) -> dict[str, torch.export.ExportedProgram]:
        """Freshly exported programs, one per method, from new modules that share one root."""
        out = {}
        for name, module in self.modules().items():
            if methods(name):
                key, fqns = export_key(self.spec, self.spec.method(name))
                out[name] = EXPORT_FORMS.export(module, self.example_inputs(name), key, fqns)
        return out

    def state_fqns(self) -> dict[str, torch.Tensor]:
        """Initial value of every buffer some method writes, by the FQN export gives it."""
        out = {}
        for owner, name in sorted(self.spec.written()):
            method = self.spec.method(owner) if owner != SHARED else None
            c = method.private(name) if method else self.spec.shared_constant(name)
            assert c is not None
            out[name if method else f"{SHARED}.{name}"] = make_tensor(c)
        return out

    def buffer_fqns(self) -> dict[str, torch.Tensor]:
        """Initial value of every buffer of the program, written or only read, by each FQN export gives it."""
        return buffers_by_fqn(self.modules().values())

    def eager(self) -> list[EagerCall]:
        """The spec's call sequence run eagerly, computed once."""
        if self._eager is None:
            self._eager = self.run_eager(self.spec.call_sequence)
        return self._eager

    def run_eager(self, sequence: tuple[str, ...]) -> list[EagerCall]:
        """``sequence`` run eagerly on one fresh set of modules, state carried across calls; a
        reduced-precision program runs a second time widened to float64 (EagerCall.wide)."""
        calls = self._run(sequence, None)
        if reduced_precision(torch.empty((), dtype=getattr(torch, self.spec.dtype))):
            for call, wide in zip(calls, self._run(sequence, torch.float64), strict=True):
                call.wide = wide
        return calls

    def _run(self, sequence: tuple[str, ...], widen: torch.dtype | None) -> list[EagerCall]:
        modules = self.modules()
        if widen is not None:  # the same values, exactly: every floating tensor of the program converted
            for module in modules.values():
                module.to(widen)
        calls = []
        with torch.no_grad():
            for i, name in enumerate(sequence):
                inputs = self.example_inputs(name, i)
                if widen is not None:
                    inputs = tuple(t.to(widen) for t in inputs)
                given = tuple(t.clone() for t in inputs)
                out = modules[name](*given)
                calls.append(
                    EagerCall(name, inputs, [out.clone()], tuple(t.clone() for t in given), _state(modules))
                )
        return calls


def _state(modules: dict[str, MethodModule]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for m in modules.values():
        written = {w.target for w in m.spec_method.writes}
        for name in written:
            if m.spec_method.private(name):
                out[name] = at_path(m, name).clone()
            else:
                out[f"{SHARED}.{name}"] = at_path(m.shared, name).clone()
    return out
