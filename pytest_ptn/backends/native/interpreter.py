"""An eager interpreter for the methods of an ExecuTorch native program (``program.ptg`` in a ``.ptn``).

Each node of a method graph is run with the torch op it names (:mod:`pytest_ptn.backends.native.graph`).
State follows the package's own semantics, program-wide and shared by every method:

* a data key that any method mutates (``NamedTensorRef.mutated``, or a ``BUFFER_MUTATION``
  target) gets one private, writable tensor, a clone of the package data;
* a non-persistent buffer (``MutableBufferSpec``) gets one tensor per fqn, the package data
  when the fqn has some, else zeros shaped by the method's ``tensor_values`` (that is what
  ExecuTorch's runtime does, so a read-only non-persistent buffer comes out zero-filled);
* every other constant is bound read-only from the package.

After every call the ``BUFFER_MUTATION`` outputs are written back into ``state`` and the
``USER_INPUT_MUTATION`` outputs into the caller's input tensors; only ``USER_OUTPUT`` values
are returned. Two interpreters over one package share no state.

Importing this module needs torch only; executorch is never imported here (the program
objects come from :mod:`pytest_ptn.backends.native.package`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from pytest_ptn.backends.native.graph import OP_OUTPUT, GraphRunner, iter_graphs
from pytest_ptn.backends.native.package import PtnPackage, scalar_type_to_dtype, shape_fits

# Enum values of executorch/backends/native/serialization/native_graph.fbs (append-only there).
_OUT_USER, _OUT_BUFFER_MUTATION, _OUT_USER_INPUT_MUTATION = 0, 1, 2


def _dims(meta: Any, what: str) -> list[int]:
    sizes: list[int] = []
    for d in meta.sizes or []:
        if d.min == d.max:
            sizes.append(int(d.min))
        elif d.max >= 0:
            sizes.append(int(d.max))
        else:
            raise NotImplementedError(f"{what}: unbounded dynamic dimension {d}")
    return sizes


def _zeros(meta: Any, what: str) -> torch.Tensor:
    """A zero tensor with the meta's dtype, shape and dim order."""
    sizes = _dims(meta, what)
    dtype = scalar_type_to_dtype(meta.dtype)
    order = list(meta.dim_order or range(len(sizes)))
    if order == list(range(len(sizes))):
        return torch.zeros(sizes, dtype=dtype)
    if sorted(order) != list(range(len(sizes))):
        raise ValueError(f"{what}: dim_order {order} is not a permutation of {len(sizes)} dims")
    physical = torch.zeros([sizes[d] for d in order], dtype=dtype)
    return physical.permute([order.index(d) for d in range(len(sizes))])


def _meta_str(meta: Any) -> str:
    try:
        return f"{scalar_type_to_dtype(meta.dtype)} {_dims(meta, 'meta')}"
    except (NotImplementedError, ValueError):
        return repr(meta)


def _dequantize_affine(qdata: torch.Tensor, meta: Any, scheme: Any, scale: torch.Tensor, zp: Any, what: str):
    """``value = scale * ((qdata + quant_min) - zero_point)``, groups along the last axis."""
    sizes = _dims(meta, what)
    numel = math.prod(sizes)
    levels = int(scheme.quant_max) - int(scheme.quant_min) + 1
    bits = max(1, (levels - 1).bit_length())
    flat = qdata.reshape(-1).view(torch.uint8) if qdata.dtype != torch.uint8 else qdata.reshape(-1)
    if flat.numel() != numel:
        per_byte = 8 // bits if bits <= 4 else 1
        if per_byte == 1 or not sizes or sizes[-1] % per_byte or flat.numel() * per_byte != numel:
            raise NotImplementedError(
                f"{what}: packed storage of {flat.numel()} bytes for {bits}-bit values of shape {sizes}"
            )
        shifts = torch.arange(per_byte, dtype=torch.uint8) * bits  # LSB first
        flat = ((flat.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).reshape(-1)
    q = flat.to(torch.int32).reshape(sizes) + int(scheme.quant_min)
    k = sizes[-1] if sizes else 1
    group = int(scheme.group_size) or k
    n_groups = -(-k // group)
    lead = sizes[:-1]

    def per_element(t: torch.Tensor, name: str) -> torch.Tensor:
        if t.numel() != math.prod(lead) * n_groups:
            raise ValueError(f"{what}: {name} has {t.numel()} values, expected {lead} x {n_groups} groups")
        return t.reshape([*lead, n_groups]).repeat_interleave(group, dim=-1)[..., :k]

    values = q.to(torch.float32)
    if zp is not None:
        values = values - per_element(zp, "zero_point").to(torch.float32)
    out = per_element(scale, "scale").to(torch.float32) * values
    return out.to(scalar_type_to_dtype(scheme.scale_dtype))


@dataclass
class _Plan:
    """What one method needs bound before every call, computed on its first call."""

    constants: dict[str, torch.Tensor] = field(default_factory=dict)  # SSA name -> read-only tensor
    state_bindings: dict[str, str] = field(default_factory=dict)  # SSA name -> state key
    output_node: Any = None
    specs: list[Any | None] = field(default_factory=list)  # parallel to output_node.inputs


class PtnInterpreter:
    """Runs the methods of a native ``.ptn`` program eagerly, with program-wide shared state."""

    def __init__(self, package: PtnPackage) -> None:
        self.package = package
        self.program = package.program
        self._methods: dict[str, Any] = {m.name: m for m in self.program.methods}
        self._plans: dict[str, _Plan] = {}
        self._dequantized: dict[str, torch.Tensor] = {}
        self._runner = GraphRunner()
        self.state: dict[str, torch.Tensor] = {}
        self._init_state()

    # ------------------------------------------------------------------------------------------
    # state
    # ------------------------------------------------------------------------------------------

    @property
    def method_names(self) -> list[str]:
        return [m.name for m in self.program.methods]

    def _init_state(self) -> None:
        mutable: dict[str, str] = {}  # data key -> first method that makes it mutable
        buffers: dict[str, tuple[str, Any]] = {}  # fqn -> (method, meta)
        for method in self.program.methods:
            for const in method.constants or []:
                if const.mutated:
                    mutable.setdefault(const.data_key, method.name)
            metas = {tv.name: tv.meta for tv in method.graph.tensor_values or []}
            for mb in method.mutable_buffers or []:
                meta = metas.get(mb.name)
                if meta is None:
                    raise ValueError(
                        f"method {method.name!r}: mutable buffer {mb.name!r} (fqn {mb.fqn!r}) "
                        "has no tensor metadata"
                    )
                previous = buffers.get(mb.fqn)
                if previous is not None and _meta_str(previous[1]) != _meta_str(meta):
                    raise ValueError(
                        f"mutable buffer {mb.fqn!r} is {_meta_str(previous[1])} in method {previous[0]!r} "
                        f"but {_meta_str(meta)} in method {method.name!r}"
                    )
                buffers.setdefault(mb.fqn, (method.name, meta))
        for method in self.program.methods:
            for spec in method.output_specs or []:
                if int(spec.kind) != _OUT_BUFFER_MUTATION:
                    continue
                target = spec.target or ""
                if target in mutable or target in buffers:
                    continue
                if target not in self.package:
                    raise ValueError(
                        f"method {method.name!r}: output {spec.name!r} mutates {target!r}, which is neither "
                        "a data key of the package nor a mutable buffer"
                    )
                mutable[target] = method.name
        for key in sorted(mutable):
            for method in self.program.methods:
                for const in method.constants or []:
                    if const.data_key == key and const.meta is not None and const.meta.quant is not None:
                        raise NotImplementedError(
                            f"method {method.name!r}: mutable data key {key!r} is quantized; "
                            "quantized state is not supported"
                        )
            self.state[key] = self.package.tensor(key).clone()
        for fqn in sorted(buffers):
            method_name, meta = buffers[fqn]
            if fqn in self.state:
                continue
            if fqn in self.package:
                self.state[fqn] = self.package.tensor(fqn).clone()
            else:
                self.state[fqn] = _zeros(meta, f"method {method_name!r} mutable buffer {fqn!r}")

    # ------------------------------------------------------------------------------------------
    # per-method plan
    # ------------------------------------------------------------------------------------------

    def _method(self, name: str) -> Any:
        try:
            return self._methods[name]
        except KeyError:
            raise KeyError(
                f"{self.package.path}: no method {name!r}; methods are {self.method_names}"
            ) from None

    def _constant(self, method: Any, const: Any) -> torch.Tensor:
        key = const.data_key
        quant = const.meta.quant if const.meta is not None else None
        if quant is None:
            return self.package.tensor(key)
        what = f"method {method.name!r} constant {const.name!r} (data key {key!r})"
        scheme = quant.scheme
        if type(scheme).__name__ != "AffineGroup":
            codec = getattr(scheme, "codec", type(scheme).__name__)
            raise NotImplementedError(f"{what}: quantization scheme {codec!r} is not supported")
        if key not in self._dequantized:
            zp = self.package.tensor(scheme.zero_point_data_key) if scheme.zero_point_data_key else None
            self._dequantized[key] = _dequantize_affine(
                self.package.tensor(key),
                const.meta,
                scheme,
                self.package.tensor(scheme.scale_data_key),
                zp,
                what,
            )
        return self._dequantized[key]

    def _plan(self, method: Any) -> _Plan:
        plan = self._plans.get(method.name)
        if plan is not None:
            return plan
        where = f"method {method.name!r}"
        for graph in iter_graphs(method.graph):
            for tv in graph.tensor_values or []:
                if tv.meta is not None and tv.meta.quant is not None:
                    raise NotImplementedError(
                        f"{where}: quantized graph value {tv.name!r} is not supported "
                        "(only quantized constants are)"
                    )
        plan = _Plan()
        for const in method.constants or []:
            if const.data_key in self.state:
                plan.state_bindings[const.name] = const.data_key
            else:
                plan.constants[const.name] = self._constant(method, const)
        for mb in method.mutable_buffers or []:
            plan.state_bindings[mb.name] = mb.fqn
        for node in method.graph.nodes:
            for na in node.inputs or []:
                value = na.arg.value
                if na.mutated and type(value).__name__ == "TensorArg" and value.name in plan.constants:
                    key = next(c.data_key for c in method.constants if c.name == value.name)
                    raise ValueError(
                        f"{where}: node {node.name!r} writes in place to immutable constant {value.name!r} "
                        f"(data key {key!r})"
                    )
        outputs = [n for n in method.graph.nodes if int(n.op_kind) == OP_OUTPUT]
        if len(outputs) != 1:
            raise ValueError(f"{where}: expected one output node, found {len(outputs)}")
        plan.output_node = outputs[0]
        specs = list(method.output_specs or [])
        j = 0
        for na in plan.output_node.inputs or []:
            value = na.arg.value
            spec = None
            if type(value).__name__ == "TensorArg" and j < len(specs) and specs[j].name == value.name:
                spec = specs[j]
                j += 1
            plan.specs.append(spec)
        if j != len(specs):
            raise ValueError(
                f"{where}: output_specs {[s.name for s in specs]} do not match the output node's tensor "
                f"values in order"
            )
        for spec in specs:
            kind = int(spec.kind)
            if kind == _OUT_USER_INPUT_MUTATION and spec.target not in (method.graph.inputs or []):
                raise ValueError(
                    f"{where}: output {spec.name!r} mutates {spec.target!r}, which is not a user input"
                )
            if kind not in (_OUT_USER, _OUT_BUFFER_MUTATION, _OUT_USER_INPUT_MUTATION):
                raise NotImplementedError(f"{where}: output {spec.name!r} has unknown output kind {kind}")
        self._plans[method.name] = plan
        return plan

    # ------------------------------------------------------------------------------------------
    # running
    # ------------------------------------------------------------------------------------------

    def run(self, method: str, inputs: Sequence[torch.Tensor]) -> list[Any]:
        """Run ``method`` on ``inputs``; return its user outputs in order, after applying its mutations."""
        m = self._method(method)
        plan = self._plan(m)
        where = f"method {method!r}"
        names = list(m.graph.inputs or [])
        inputs = list(inputs)
        if len(inputs) != len(names):
            raise ValueError(f"{where} takes {len(names)} inputs {names}, got {len(inputs)}")
        self._check_inputs(m, names, inputs, where)
        env: dict[str, Any] = dict(zip(names, inputs, strict=True))
        env.update(plan.constants)
        for name, key in plan.state_bindings.items():
            env[name] = self.state[key]
        self._runner.run_graph(m.graph, env, where, stop_at_output=True)

        results = [self._runner.arg(na.arg.value, env, where, None) for na in plan.output_node.inputs or []]
        user: list[Any] = []
        for spec, value in zip(plan.specs, results, strict=True):
            kind = _OUT_USER if spec is None else int(spec.kind)
            if spec is None or kind == _OUT_USER:
                user.append(value)
            elif kind == _OUT_BUFFER_MUTATION:
                self._write_back(self.state[spec.target], value, f"{where}: state {spec.target!r}")
            elif kind == _OUT_USER_INPUT_MUTATION:
                self._write_back(inputs[names.index(spec.target)], value, f"{where}: input {spec.target!r}")
        return user

    @staticmethod
    def _write_back(dst: torch.Tensor, value: Any, what: str) -> None:
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{what}: mutation value is {type(value).__name__}, not a tensor")
        if value is dst:
            return  # mutated in place already (e.g. index_put_ on the state tensor)
        if value.shape != dst.shape:
            raise ValueError(f"{what}: mutation writes shape {list(value.shape)} into {list(dst.shape)}")
        if value.untyped_storage().data_ptr() == dst.untyped_storage().data_ptr():
            value = value.clone()
        dst.copy_(value)

    def _check_inputs(self, method: Any, names: list[str], inputs: list[Any], where: str) -> None:
        metas = {tv.name: tv.meta for tv in method.graph.tensor_values or []}
        for name, value in zip(names, inputs, strict=True):
            meta = metas.get(name)
            if meta is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{where}: input {name!r} must be a tensor, got {type(value).__name__}")
            dtype = scalar_type_to_dtype(meta.dtype)
            if value.dtype != dtype or not shape_fits(meta.sizes or [], value.shape):
                raise ValueError(
                    f"{where}: input {name!r} is {value.dtype} {list(value.shape)}, the program expects "
                    f"{_meta_str(meta)}"
                )


__all__ = ["PtnInterpreter"]
