"""Running one graph of a native program (``program.ptg`` in a ``.ptn``) node by node, each node
with the torch op it names, the higher-order ops cond, while_loop and map included (their subgraphs
are run the same way). Kept apart from the interpreter, which owns state and binds a method's inputs,
constants and mutations around this.

Importing this module needs torch only; executorch is never imported here.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from pytest_ptn.backends.native.package import scalar_type_to_dtype

# Enum values of executorch/backends/native/serialization/native_graph.fbs (append-only there).
OP_CALL_FUNCTION, OP_PLACEHOLDER, OP_OUTPUT = 0, 1, 2
_VAL_TENSOR, _VAL_TENSOR_LIST = 0, 1

_LAYOUTS: dict[str, torch.layout] = {
    str(v): v
    for v in (
        getattr(torch, name, None)
        for name in ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "_mkldnn")
    )
    if isinstance(v, torch.layout)
}
_MEMORY_FORMATS: dict[str, torch.memory_format] = {
    str(v): v
    for v in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d, torch.preserve_format)
}

_HOP_COND = "torch.ops.higher_order.cond"
_HOP_WHILE = "torch.ops.higher_order.while_loop"
_HOP_MAP = "torch.ops.higher_order.map_impl"
_BUILTINS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "bool": bool,
    "float": float,
    "int": int,
    "max": max,
    "min": min,
    "pow": pow,
    "round": round,
}


def resolve_target(target: str) -> Callable[..., Any]:
    """The callable a node target names: ``torch.ops.<ns>.<op>.<overload>``, ``_operator.*``,
    ``math.*``, ``torch.sym_*``/``torch._sym_*`` or a few builtins. Anything else is refused
    (a package must not be able to name arbitrary Python callables)."""
    parts = target.split(".")
    fn: Any = None
    if len(parts) == 5 and parts[:2] == ["torch", "ops"]:
        fn = getattr(torch.ops, parts[2], None)
        for part in parts[3:]:
            fn = getattr(fn, part, None) if fn is not None else None
        if not isinstance(fn, torch._ops.OpOverload):
            fn = None
    elif len(parts) == 2 and parts[0] == "torch":
        if parts[1].startswith(("sym_", "_sym_")):
            fn = getattr(torch, parts[1], None)
    elif len(parts) == 2 and not parts[1].startswith("_") and parts[1].isidentifier():
        module, name = parts
        if module in ("_operator", "operator"):
            fn = getattr(operator, name, None)
        elif module == "math":
            fn = getattr(math, name, None)
        elif module == "builtins":
            fn = _BUILTINS.get(name)
    if fn is None or not callable(fn):
        raise NotImplementedError(f"unknown op {target!r}: the interpreter cannot resolve it")
    return fn


def iter_graphs(graph: Any) -> Iterator[Any]:
    """The graph and every nested HOP subgraph (GraphArg) in it."""
    yield graph
    for node in graph.nodes:
        for na in node.inputs or []:
            value = na.arg.value
            if type(value).__name__ == "GraphArg":
                yield from iter_graphs(value.graph)


class GraphRunner:
    """Runs graphs in an ``env`` the caller binds; holds only the resolved op targets, so one runner
    serves every method of a program."""

    def __init__(self) -> None:
        self._fn_cache: dict[str, Callable[..., Any]] = {}

    def run_graph(
        self, graph: Any, env: dict[str, Any], where: str, stop_at_output: bool = False
    ) -> list[Any]:
        """Run ``graph``'s nodes in ``env``, which gets their outputs; the output node's values, or
        ``[]`` with ``stop_at_output`` (a method's caller reads its output node itself)."""
        for node in graph.nodes:
            kind = int(node.op_kind)
            if kind == OP_PLACEHOLDER:
                if node.name not in env:
                    raise ValueError(f"{where}: placeholder {node.name!r} is not bound")
            elif kind == OP_CALL_FUNCTION:
                self._call(node, env, where)
            elif kind == OP_OUTPUT:
                if stop_at_output:
                    return []
                return [self.arg(na.arg.value, env, where, None) for na in node.inputs or []]
            else:
                raise NotImplementedError(f"{where}: node {node.name!r} has unknown op kind {kind}")
        raise ValueError(f"{where}: graph has no output node")

    def _run_subgraph(self, graph: Any, operands: Sequence[Any], where: str) -> list[Any]:
        names = list(graph.inputs or [])
        if len(names) != len(operands):
            raise ValueError(f"{where}: subgraph takes {len(names)} operands {names}, got {len(operands)}")
        return self.run_graph(graph, dict(zip(names, operands, strict=True)), where)

    # ---- arguments -----------------------------------------------------------------------------

    @staticmethod
    def _lookup(env: dict[str, Any], name: str, where: str) -> Any:
        try:
            return env[name]
        except KeyError:
            raise ValueError(f"{where}: value {name!r} is not defined") from None

    def arg(self, value: Any, env: dict[str, Any], where: str, schema_type: Any) -> Any:
        """The value of one node argument: a name bound in ``env``, a literal or a subgraph;
        ``schema_type`` (the op's argument type, if any) says how a string reads."""
        kind = type(value).__name__
        if kind == "TensorArg":
            return self._lookup(env, value.name, where)
        if kind == "NoneArg":
            return None
        if kind == "IntArg":
            return self._lookup(env, value.ref, where) if value.ref else int(value.value)
        if kind == "FloatArg":
            return self._lookup(env, value.ref, where) if value.ref else float(value.value)
        if kind == "BoolArg":
            return self._lookup(env, value.ref, where) if value.ref else bool(value.value)
        if kind == "StringArg":
            return self._string(str(value.value), schema_type, where)
        if kind == "ScalarTypeArg":
            return scalar_type_to_dtype(value.value)
        if kind == "IntListArg":
            refs = list(value.refs or [])
            if refs and len(refs) != len(value.values):
                raise ValueError(f"{where}: IntListArg has {len(value.values)} values but {len(refs)} refs")
            refs = refs or [""] * len(value.values)
            return [
                self._lookup(env, r, where) if r else int(v) for v, r in zip(value.values, refs, strict=True)
            ]
        if kind == "FloatListArg":
            return [float(v) for v in value.values]
        if kind == "BoolListArg":
            return [bool(v) for v in value.values]
        if kind == "TensorListArg":
            return [self._lookup(env, n, where) for n in value.names]
        if kind == "OptionalTensorListArg":
            if len(value.names) != len(value.has_value):
                raise ValueError(f"{where}: OptionalTensorListArg names and has_value differ in length")
            return [
                self._lookup(env, n, where) if h else None
                for n, h in zip(value.names, value.has_value, strict=True)
            ]
        if kind == "GraphArg":
            return value.graph
        raise NotImplementedError(f"{where}: argument kind {kind!r} is not supported")

    @staticmethod
    def _string(text: str, schema_type: Any, where: str) -> Any:
        type_name = str(schema_type) if schema_type is not None else ""
        if type_name.startswith("Optional[") and type_name.endswith("]"):
            type_name = type_name[len("Optional[") : -1]
        try:
            if type_name == "Device":
                return torch.device(text)
            if type_name == "Layout":
                return _LAYOUTS[text]
            if type_name == "MemoryFormat":
                return _MEMORY_FORMATS[text]
        except (KeyError, RuntimeError):
            raise ValueError(f"{where}: {text!r} is not a valid {type_name}") from None
        if not type_name:  # schema-less call: recognise the spellings the serializer emits
            return _LAYOUTS.get(text, _MEMORY_FORMATS.get(text, text))
        return text

    # ---- calls ---------------------------------------------------------------------------------

    def _resolve(self, target: str, where: str) -> Callable[..., Any]:
        fn = self._fn_cache.get(target)
        if fn is None:
            try:
                fn = resolve_target(target)
            except NotImplementedError as exc:
                raise NotImplementedError(f"{where}: {exc}") from None
            self._fn_cache[target] = fn
        return fn

    def _call(self, node: Any, env: dict[str, Any], where: str) -> None:
        target = node.target or ""
        ctx = f"{where}, node {node.name!r} ({target})"
        inputs = node.inputs or []
        if target in (_HOP_COND, _HOP_WHILE, _HOP_MAP):
            operands = [self.arg(na.arg.value, env, ctx, None) for na in inputs]
            out: Any = self._higher_order(target, operands, ctx)
            self._bind_outputs(node, out, env, ctx, multi=True)
            return
        fn = self._resolve(target, ctx)
        if isinstance(fn, torch._ops.OpOverload):
            args, kwargs = self._bind_schema(fn, inputs, env, ctx)
            multi = len(fn._schema.returns) > 1
        else:
            args = [self.arg(na.arg.value, env, ctx, None) for na in inputs if not na.name]
            kwargs = {na.name: self.arg(na.arg.value, env, ctx, None) for na in inputs if na.name}
            multi = False
        try:
            out = fn(*args, **kwargs)
        except Exception as exc:
            raise RuntimeError(f"{ctx} failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(fn, torch._ops.OpOverload) and isinstance(out, (tuple, list)):
            multi = len(node.outputs or []) != 1 or int(node.outputs[0].kind) != _VAL_TENSOR_LIST
        self._bind_outputs(node, out, env, ctx, multi=multi)

    def _bind_schema(
        self, fn: torch._ops.OpOverload, inputs: Sequence[Any], env: dict[str, Any], where: str
    ) -> tuple[list[Any], dict[str, Any]]:
        given: dict[str, Any] = {}
        for na in inputs:
            if not na.name:
                raise ValueError(f"{where}: unnamed argument to schema op {fn._schema.name}")
            given[na.name] = na
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        positional = True
        for sarg in fn._schema.arguments:
            na = given.pop(sarg.name, None)
            if na is None:
                if not sarg.has_default_value():
                    raise ValueError(f"{where}: missing required argument {sarg.name!r}")
                positional = False  # later arguments must go by name
                continue
            value = self.arg(na.arg.value, env, where, getattr(sarg, "real_type", sarg.type))
            if positional and not sarg.kwarg_only:
                args.append(value)
            else:
                kwargs[sarg.name] = value
        if given:
            raise ValueError(f"{where}: arguments {sorted(given)} are not in the schema {fn._schema}")
        return args, kwargs

    def _bind_outputs(self, node: Any, out: Any, env: dict[str, Any], where: str, multi: bool) -> None:
        outs = list(node.outputs or [])
        if not outs:
            return
        if len(outs) == 1 and int(outs[0].kind) == _VAL_TENSOR_LIST:
            self._bind_list(outs[0], out, env, where)
            return
        if not multi:
            if len(outs) != 1:
                raise ValueError(f"{where}: op returned one value but the node declares {len(outs)} outputs")
            env[outs[0].name] = out
            return
        values = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(values) != len(outs):
            raise ValueError(f"{where}: op returned {len(values)} values but the node declares {len(outs)}")
        for o, v in zip(outs, values, strict=True):
            if int(o.kind) == _VAL_TENSOR_LIST:
                self._bind_list(o, v, env, where)
            else:
                env[o.name] = v

    @staticmethod
    def _bind_list(output: Any, out: Any, env: dict[str, Any], where: str) -> None:
        names = list(output.names or [])
        values = list(out) if isinstance(out, (tuple, list)) else None
        if values is None or len(values) != len(names):
            got = "a non-list" if values is None else f"{len(values)} values"
            raise ValueError(f"{where}: op returned {got} for a tensor list of {len(names)}")
        env.update(zip(names, values, strict=True))

    # ---- higher-order ops ----------------------------------------------------------------------

    def _higher_order(self, target: str, operands: list[Any], where: str) -> list[Any]:
        def graph_at(i: int) -> Any:
            if i >= len(operands) or type(operands[i]).__name__ != "Graph":
                raise ValueError(f"{where}: operand {i} must be a subgraph")
            return operands[i]

        def list_at(i: int) -> list[Any]:
            if i >= len(operands) or not isinstance(operands[i], (list, tuple)):
                raise ValueError(f"{where}: operand {i} must be a list")
            return list(operands[i])

        if target == _HOP_COND:
            if len(operands) != 4:
                raise ValueError(f"{where}: cond takes 4 operands, got {len(operands)}")
            branch = graph_at(1) if _truth(operands[0], where) else graph_at(2)
            return self._run_subgraph(branch, list_at(3), f"{where} branch")
        if target == _HOP_WHILE:
            if len(operands) != 4:
                raise ValueError(f"{where}: while_loop takes 4 operands, got {len(operands)}")
            cond_g, body_g, carried, extra = graph_at(0), graph_at(1), list_at(2), list_at(3)
            while _truth(self._run_subgraph(cond_g, carried + extra, f"{where} cond")[0], where):
                carried = self._run_subgraph(body_g, carried + extra, f"{where} body")
            return carried
        # map_impl(body, xs, pos_args): body over the leading dim of every xs, results stacked.
        if len(operands) != 3:
            raise ValueError(f"{where}: map_impl takes 3 operands, got {len(operands)}")
        body, xs, extra = graph_at(0), list_at(1), list_at(2)
        if not xs or xs[0].shape[0] == 0:
            raise ValueError(f"{where}: map over an empty leading dimension")
        steps = [
            self._run_subgraph(body, [x[i] for x in xs] + extra, f"{where} body")
            for i in range(xs[0].shape[0])
        ]
        return [torch.stack([step[k] for step in steps]) for k in range(len(steps[0]))]


def _truth(value: Any, where: str) -> bool:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{where}: predicate has {value.numel()} elements")
        return bool(value.item())
    return bool(value)


__all__ = ["OP_CALL_FUNCTION", "OP_OUTPUT", "OP_PLACEHOLDER", "GraphRunner", "iter_graphs", "resolve_target"]
