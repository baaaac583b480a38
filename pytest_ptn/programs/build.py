"""Turn a ProgramSpec into real multi-method torch modules, fresh exports and eager expectations.

Every call of ``export`` builds new modules: ExecuTorch's ``to_native`` empties ``ep.constants`` of the
programs it lowers, so an ExportedProgram is good for one lowering only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from pytest_ptn.backend import EagerCall
from pytest_ptn.instruments.comparison import reduced_precision
from pytest_ptn.programs.export_forms import EXPORT_FORMS
from pytest_ptn.spec import SHARED, Constant, Method, ProgramSpec


def make_tensor(c: Constant) -> torch.Tensor:
    """The deterministic value of a constant: its ``values``, else drawn from its ``seed``, in ``drawn_as``
    and read as its dtype where given, its ``nudged`` elements moved."""
    dtype = getattr(torch, c.dtype)
    drawn = _drawn(c, getattr(torch, c.drawn_as or c.dtype))
    t = drawn.view(dtype) if drawn.dtype != dtype else drawn
    if not c.nudged:
        return t
    flat = t.reshape(-1).clone()
    for i in c.nudged:
        x = flat[i]
        if dtype.is_floating_point:
            moved = (x.double() + max(abs(float(x)), 1.0) / 256).to(dtype)
            flat[i] = (
                moved if moved != x else torch.nextafter(x.float(), torch.tensor(float("inf"))).to(dtype)
            )
        else:
            flat[i] = x + 1
    return flat.reshape(c.shape)


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


def _register(module: nn.Module, c: Constant) -> None:
    value = make_tensor(c)
    if c.family == "parameter":
        module.register_parameter(c.name, nn.Parameter(value, requires_grad=False))
    elif c.family == "buffer":
        module.register_buffer(c.name, value, persistent=c.persistent)
    elif c.family == "attribute":
        object.__setattr__(module, c.name, value)
    elif c.family == "int8_linear":
        linear = nn.Linear(c.shape[1], c.shape[0], bias=False)
        linear.weight.data = value.to(torch.float32)
        module.add_module(c.name, linear)
    elif c.family == "linear":
        linear = nn.Linear(c.shape[1], c.shape[0], dtype=value.dtype).requires_grad_(False)
        linear.weight.copy_(value)
        linear.bias.copy_(make_tensor(replace(c, shape=c.shape[:1], seed=c.seed + 1)))
        module.add_module(c.name, linear)


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
        for c in spec.shared:
            _register(self, c)
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
        for c in method.constants:
            _register(self, c)
        _quantize(self, method.constants)
        if method.branch is not None:
            _register(self, method.branch.on_true)
            _register(self, method.branch.on_false)

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
            return getattr(owner, name)(x)
        return getattr(owner, name)

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
            true_t = getattr(self, m.branch.on_true.name)
            false_t = getattr(self, m.branch.on_false.name)

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
    dtype, shape and persistence (a literal's or scalar's values too), what it reads and writes by
    position, its input and the root's second path. None for a method torch may export differently under
    other names (a branch's subgraphs) or that holds a tensor on a child module (a linear layer's weight)."""
    own = method.constants
    if method.branch is not None or any(c.family in _CHILD_MODULES for c in (*spec.shared, *own)):
        return None, ()

    def slot(c: Constant) -> tuple[object, ...]:
        values = (c.values, c.seed) if c.family in _TRACED_VALUES else ()
        return (c.family, c.dtype, c.shape, c.persistent, values)

    position = {c.name: ("s", i) for i, c in enumerate(spec.shared)}
    position |= {c.name: ("m", i) for i, c in enumerate(own)}
    roots = (SHARED, *((spec.shared_alias,) if spec.shared_alias is not None else ()))
    key = (
        spec.dtype,
        spec.vectors,
        len(roots),
        tuple(map(slot, spec.shared)),
        tuple(map(slot, own)),
        tuple(position[n] for n in method.reads),
        tuple((position[w.target], w.op) for w in method.writes),
        method.input_shape,
        method.mutates_input,
    )
    fqns = tuple(f"{root}.{c.name}" for root in roots for c in spec.shared) + tuple(c.name for c in own)
    return repr(key), fqns


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
        out: dict[str, torch.Tensor] = {}
        for module in self.modules().values():
            for key, t in module.named_buffers(remove_duplicate=False):
                out.setdefault(key, t.clone())
        return out

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
                out[name] = getattr(m, name).clone()
            else:
                out[f"{SHARED}.{name}"] = getattr(m.shared, name).clone()
    return out
