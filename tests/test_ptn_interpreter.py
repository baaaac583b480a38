"""The .ptn interpreter against eager PyTorch: outputs and state over several calls."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # executorch's import uses deprecated importlib.resources APIs
    pytest.importorskip("executorch")
    import torch
    from executorch.backends.native.serialization import graph_serialize
    from executorch.backends.native.serialization import schema as S
    from executorch.exir._serialize._ptn import write_ptn
    from executorch.exir.native import to_native
    from torch import nn

from pytest_ptn.backends.native.graph import resolve_target  # noqa: E402
from pytest_ptn.backends.native.interpreter import PtnInterpreter  # noqa: E402
from pytest_ptn.backends.native.package import PtnPackage, read_ptn, scalar_type_to_dtype  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

GOLDEN = Path(__file__).resolve().parent.parent / "fixtures" / "golden" / "linear_buffer.ptn"


def export(model: nn.Module, *args: Any, **kwargs: Any) -> torch.export.ExportedProgram:
    """Export a copy, so eager runs on the original never see export's side effects."""
    return torch.export.export(copy.deepcopy(model), args, **kwargs)


def lower(tmp_path: Path, programs: Any, name: str = "m") -> PtnInterpreter:
    path = tmp_path / f"{name}.ptn"
    to_native(programs).save(str(path))
    return PtnInterpreter(read_ptn(path))


def serialize(tmp_path: Path, ep: torch.export.ExportedProgram, name: str = "g") -> PtnInterpreter:
    """For programs to_native cannot lower (cond, while, multi-output ops): serialize the aten graph,
    functionalized first (export's training IR keeps in-place ops on buffers and inputs)."""
    ep = ep.run_decompositions({})
    ptg, data = graph_serialize.serialize_graph(
        ep.graph_module, ep.graph_signature, ep.state_dict, ep.constants
    )
    mutable = frozenset(k for k in ep.graph_signature.buffers_to_mutate.values() if k in data)
    path = tmp_path / f"{name}.ptn"
    write_ptn(str(path), ptg, data, mutable_keys=mutable)
    return PtnInterpreter(read_ptn(path))


def as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def assert_same(expected: Any, got: Sequence[Any]) -> None:
    expected = as_list(expected)
    assert len(got) == len(expected)
    for e, g in zip(expected, got, strict=True):
        if isinstance(e, torch.Tensor):
            assert isinstance(g, torch.Tensor)
            assert g.dtype == e.dtype and g.shape == e.shape
            torch.testing.assert_close(g, e)
        else:
            assert g == e


def run_both(
    eager: Callable[..., Any], interp: PtnInterpreter, method: str, inputs: Sequence[torch.Tensor]
) -> None:
    expected = eager(*[t.clone() for t in inputs])
    assert_same(expected, interp.run(method, [t.clone() for t in inputs]))


# ---- single-method programs through to_native ---------------------------------------------------


class LinearConstants(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) * 0.5 + torch.tensor([1.0, 2.0, 3.0])


def test_linear_lifted_scalar_and_tensor_constant(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = LinearConstants()
    it = lower(tmp_path, export(model, torch.randn(2, 4)))
    assert it.method_names == ["forward"]
    assert it.state == {}
    assert any(k.startswith("_lifted_tensor_constant") for k in it.package.tensors)
    assert "lifted_tensor_0" in it.package
    for _ in range(3):
        run_both(model, it, "forward", [torch.randn(2, 4)])


class Accumulate(nn.Module):
    acc: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("acc", torch.arange(4, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.acc.add_(x)
        return self.acc * x


def test_persistent_buffer_add_(tmp_path: Path) -> None:
    model = Accumulate()
    it = lower(tmp_path, export(model, torch.randn(4)))
    assert set(it.state) == {"acc"}
    torch.testing.assert_close(it.state["acc"], torch.arange(4, dtype=torch.float32))
    assert it.state["acc"] is not it.package.tensor("acc")  # private, writable copy
    for _ in range(3):
        run_both(model, it, "forward", [torch.randn(4)])
        torch.testing.assert_close(it.state["acc"], model.acc)
    torch.testing.assert_close(it.package.tensor("acc"), torch.arange(4, dtype=torch.float32))


class KVCache(nn.Module):
    kv: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("kv", torch.zeros(3, 4), persistent=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.kv.index_copy_(0, pos, self.proj(x))
        return self.kv.sum(0)


def test_non_persistent_kv_buffer_index_copy_(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = KVCache()
    it = lower(tmp_path, export(model, torch.randn(1, 4), torch.tensor([0])))
    assert "kv" not in it.package  # no data shipped: zero-initialized state
    assert set(it.state) == {"kv"}
    assert it.program.methods[0].mutable_buffers[0].fqn == "kv"
    for step in range(4):
        run_both(model, it, "forward", [torch.randn(1, 4), torch.tensor([step % 3])])
        torch.testing.assert_close(it.state["kv"], model.kv)


class Views(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.lin(x)
        return (
            y.transpose(0, 1),
            y.reshape(-1),
            y[:, 1:3],
            y.unsqueeze(0).expand(2, -1, -1),
            y.permute(1, 0) * 2,
        )


def test_view_outputs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Views()
    it = lower(tmp_path, export(model, torch.randn(2, 4)))
    for _ in range(2):
        run_both(model, it, "forward", [torch.randn(2, 4)])


def test_torchao_int8_weight_only(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pytest.importorskip("torchao")
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4))
    quantize_(model, Int8WeightOnlyConfig())
    it = lower(tmp_path, export(model, torch.randn(3, 8)))
    assert {t.dtype for t in it.package.tensors.values()} >= {torch.int8, torch.float32}
    for _ in range(2):
        run_both(model, it, "forward", [torch.randn(3, 8)])


def test_golden_fixture_runs() -> None:
    it = PtnInterpreter(read_ptn(GOLDEN))
    weight, bias = it.package.tensor("lin.weight"), it.package.tensor("lin.bias")
    count = torch.zeros(3)
    for step in range(3):
        x = torch.full((2, 4), float(step))
        y = (x @ weight.T + bias) * 2.0 + 2.0
        count = count + y.sum(0)
        (out,) = it.run("forward", [x])
        torch.testing.assert_close(out, y - count)
        torch.testing.assert_close(it.state["count"], count)


# ---- two methods sharing state ------------------------------------------------------------------


class Cache(nn.Module):
    cache: torch.Tensor
    kv: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(4))
        self.register_buffer("kv", torch.zeros(2, 4), persistent=False)


class Writer(nn.Module):
    def __init__(self, c: Cache) -> None:
        super().__init__()
        self.c = c

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.c.cache.add_(x)
        self.c.kv.index_copy_(0, pos, x.unsqueeze(0))
        return self.c.cache.sum()


class Reader(nn.Module):
    def __init__(self, c: Cache) -> None:
        super().__init__()
        self.c = c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.c.cache + self.c.kv.sum(0)


def two_method_program(tmp_path: Path, name: str) -> PtnInterpreter:
    x, pos = torch.randn(4), torch.tensor([0])
    programs = {"write": export(Writer(Cache()), x, pos), "read": export(Reader(Cache()), x)}
    return lower(tmp_path, programs, name)


def test_two_methods_share_a_buffer(tmp_path: Path) -> None:
    cache = Cache()
    writer, reader = Writer(cache), Reader(cache)
    it = two_method_program(tmp_path, "wr")
    assert it.method_names == ["write", "read"]
    assert set(it.state) == {"c.cache", "c.kv"}
    calls: list[tuple[str, list[torch.Tensor]]] = [
        ("read", [torch.randn(4)]),
        ("write", [torch.randn(4), torch.tensor([0])]),
        ("read", [torch.randn(4)]),
        ("write", [torch.randn(4), torch.tensor([1])]),
        ("write", [torch.randn(4), torch.tensor([0])]),
        ("read", [torch.randn(4)]),
    ]
    for method, inputs in calls:
        run_both(writer if method == "write" else reader, it, method, inputs)
        torch.testing.assert_close(it.state["c.cache"], cache.cache)
        torch.testing.assert_close(it.state["c.kv"], cache.kv)


def test_two_loaded_copies_share_no_state(tmp_path: Path) -> None:
    it = two_method_program(tmp_path, "wr")
    other = PtnInterpreter(it.package)
    it.run("write", [torch.ones(4), torch.tensor([1])])
    assert torch.count_nonzero(other.state["c.cache"]) == 0
    assert torch.count_nonzero(other.state["c.kv"]) == 0
    torch.testing.assert_close(other.run("read", [torch.ones(4)])[0], torch.zeros(4))
    torch.testing.assert_close(it.run("read", [torch.ones(4)])[0], torch.full((4,), 2.0))


# ---- programs built with serialize_graph (to_native 1.5.1 cannot lower them) -------------------


class Cond(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, -2.0, 3.0, 0.5]))

    def forward(self, p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        def true_fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
            return (x * w + 1.0,)

        def false_fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
            return (x - w,)

        return torch.cond(p, true_fn, false_fn, (x, self.w))[0] * 2


def test_cond_both_branches(tmp_path: Path) -> None:
    model = Cond()
    it = serialize(tmp_path, export(model, torch.tensor(True), torch.randn(4)))
    node = next(n for n in it.program.methods[0].graph.nodes if n.target == "torch.ops.higher_order.cond")
    assert sum(type(na.arg.value).__name__ == "GraphArg" for na in node.inputs) == 2
    for pred in (True, False, True):
        run_both(model, it, "forward", [torch.tensor(pred), torch.randn(4)])


class WhileLoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([0.5, 1.0, 1.5, 2.0]))

    def forward(self, n: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def cond_fn(i: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return i < n

        def body_fn(i: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, x * self.w + 0.5

        i, y = torch._higher_order_ops.while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), x))
        return i, y


def test_while_loop(tmp_path: Path) -> None:
    model = WhileLoop()
    it = serialize(tmp_path, export(model, torch.tensor(3), torch.randn(4)))
    for n in (0, 1, 4):
        run_both(model, it, "forward", [torch.tensor(n), torch.randn(4)])


class Map(nn.Module):
    def forward(self, xs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        from torch._higher_order_ops.map import map as hop_map

        return cast(Any, hop_map)(lambda x, y: x * y + 1.0, xs, y)


def test_map(tmp_path: Path) -> None:
    model = Map()
    it = serialize(tmp_path, export(model, torch.randn(3, 4), torch.randn(4)))
    run_both(model, it, "forward", [torch.randn(3, 4), torch.randn(4)])


class MultiOutput(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values, indices = torch.topk(x, 2)
        top, rest = torch.split(x, [1, 2], dim=0)  # Tensor[] return: a TENSOR_LIST output
        m, mi = x.max(dim=1)
        return values * 1.0, indices, top * 2, rest + 1, m, mi


def test_multi_output_and_tensor_list_ops(tmp_path: Path) -> None:
    model = MultiOutput()
    it = serialize(tmp_path, export(model, torch.randn(3, 4)))
    kinds = {int(o.kind) for n in it.program.methods[0].graph.nodes for o in n.outputs or []}
    assert int(S.OutputValueKind.TENSOR_LIST) in kinds
    run_both(model, it, "forward", [torch.randn(3, 4)])


class Dynamic(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0] * 2, -1) + 1.0


def test_dynamic_shapes_and_sym_ops(tmp_path: Path) -> None:
    model = Dynamic()
    batch = torch.export.Dim("batch", min=2, max=64)
    it = serialize(tmp_path, export(model, torch.randn(4, 4), dynamic_shapes=({0: batch},)))
    targets = {n.target for n in it.program.methods[0].graph.nodes}
    assert "_operator.mul" in targets
    for rows in (2, 5, 64):
        run_both(model, it, "forward", [torch.randn(rows, 4)])
    with pytest.raises(ValueError, match=r"input 'x' is torch.float32 \[65, 4\]"):
        it.run("forward", [torch.randn(65, 4)])


class InputMutation(nn.Module):
    steps: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1.0)
        self.steps.add_(1)
        return x * 2


def test_user_input_mutation_is_copied_back(tmp_path: Path) -> None:
    model = InputMutation()
    it = serialize(tmp_path, export(model, torch.randn(3)))
    kinds = [int(s.kind) for s in it.program.methods[0].output_specs]
    assert int(S.OutputKind.USER_INPUT_MUTATION) in kinds
    for _ in range(2):
        x = torch.randn(3)
        x_eager, x_interp = x.clone(), x.clone()
        assert_same(model(x_eager), it.run("forward", [x_interp]))
        torch.testing.assert_close(x_interp, x_eager)
        assert torch.equal(it.state["steps"], model.steps)


def test_affine_group_quantized_constant(tmp_path: Path) -> None:
    """Hand-built quant metadata (1.5.1 never emits it): int8 per-channel and packed int4 groups."""

    class MatMul(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(3, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.w.t()

    ep = export(MatMul(), torch.randn(2, 4))
    ptg, _ = graph_serialize.serialize_graph(ep.graph_module, ep.graph_signature, ep.state_dict, ep.constants)
    program = graph_serialize.deserialize_program(ptg)
    const = program.methods[0].constants[0]
    assert const.data_key == "w"
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    for qmin, qmax, group in ((-128, 127, 0), (-8, 7, 2)):
        q = torch.randint(qmin, qmax + 1, (3, 4))
        n_groups = 1 if group == 0 else 4 // group
        scale = torch.rand(3, n_groups) + 0.1
        zp = torch.randint(-2, 3, (3, n_groups)).to(torch.int32)
        unsigned = (q - qmin).to(torch.uint8)
        if qmax - qmin < 16:  # two nibbles per byte, LSB first
            unsigned = unsigned[:, 0::2] | (unsigned[:, 1::2] << 4)
        scheme = S.AffineGroup(
            scale_data_key="w.scale",
            scale_dtype=S.ScalarType.FLOAT,
            quant_min=qmin,
            quant_max=qmax,
            group_size=group,
            zero_point_data_key="w.zp",
            zero_point_dtype=S.ScalarType.INT,
        )
        const.meta = dataclasses.replace(
            const.meta, dtype=S.ScalarType.BYTE, quant=S.QuantSpec(scheme=scheme)
        )
        path = tmp_path / f"q{qmax}.ptn"
        data = {"w": unsigned.contiguous(), "w.scale": scale, "w.zp": zp}
        write_ptn(str(path), graph_serialize._compile_to_bytes(program), data)
        it = PtnInterpreter(read_ptn(path))
        reps = 4 // n_groups
        weight = scale.repeat_interleave(reps, 1) * (q - zp.repeat_interleave(reps, 1))
        (out,) = it.run("forward", [x])
        torch.testing.assert_close(out, x @ weight.t())


# ---- clear errors ------------------------------------------------------------------------------


def _golden_with(edit: Callable[[Any], None]) -> PtnInterpreter:
    pkg = read_ptn(GOLDEN)
    program = copy.deepcopy(pkg.program)
    edit(program)
    return PtnInterpreter(
        PtnPackage(path=pkg.path, program=program, tensors=pkg.tensors, aliases=pkg.aliases)
    )


def _first_call(program: Any) -> Any:
    return next(n for n in program.methods[0].graph.nodes if n.op_kind == S.OpKind.CALL_FUNCTION)


def test_unknown_op_is_named() -> None:
    def edit(program: Any) -> None:
        _first_call(program).target = "torch.ops.aten.no_such_op.default"

    it = _golden_with(edit)
    with pytest.raises(
        NotImplementedError, match=r"method 'forward'.*unknown op 'torch.ops.aten.no_such_op.default'"
    ):
        it.run("forward", [torch.zeros(2, 4)])


def test_unknown_argument_kind_is_named() -> None:
    @dataclasses.dataclass
    class FancyArg:
        value: int = 0

    def edit(program: Any) -> None:
        _first_call(program).inputs[0].arg.value = FancyArg()

    it = _golden_with(edit)
    with pytest.raises(NotImplementedError, match="argument kind 'FancyArg' is not supported"):
        it.run("forward", [torch.zeros(2, 4)])


@pytest.mark.parametrize(
    "target",
    ["os.system", "builtins.eval", "builtins.__import__", "torch.load", "torch.ops.aten.add", "_operator._x"],
)
def test_resolve_target_refuses_arbitrary_callables(target: str) -> None:
    with pytest.raises(NotImplementedError, match="unknown op"):
        resolve_target(target)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("torch.ops.aten.add.Tensor", torch.ops.aten.add.Tensor),
        ("_operator.getitem", __import__("operator").getitem),
        ("torch.sym_max", torch.sym_max),
        ("math.floor", __import__("math").floor),
    ],
)
def test_resolve_target(target: str, expected: Any) -> None:
    assert resolve_target(target) is expected


def test_scalar_types() -> None:
    assert scalar_type_to_dtype(S.ScalarType.BFLOAT16) is torch.bfloat16
    assert scalar_type_to_dtype(11) is torch.bool
    with pytest.raises(NotImplementedError, match="unsupported ScalarType 9"):
        scalar_type_to_dtype(9)


def test_bad_calls_are_named() -> None:
    it = PtnInterpreter(read_ptn(GOLDEN))
    with pytest.raises(KeyError, match="no method 'decode'"):
        it.run("decode", [])
    with pytest.raises(ValueError, match=r"method 'forward' takes 1 inputs \['x'\], got 2"):
        it.run("forward", [torch.zeros(2, 4), torch.zeros(1)])
    with pytest.raises(ValueError, match="input 'x' is torch.int64"):
        it.run("forward", [torch.zeros(2, 4, dtype=torch.int64)])


def test_write_to_immutable_constant_is_refused() -> None:
    def edit(program: Any) -> None:
        method = program.methods[0]
        weight = next(c.name for c in method.constants if c.data_key == "lin.weight")
        node = _first_call(program)
        node.inputs[0] = S.NamedArgument(
            arg=S.Argument(value=S.TensorArg(name=weight)), name="self", mutated=True
        )

    it = _golden_with(edit)
    with pytest.raises(ValueError, match="writes in place to immutable constant .*'lin.weight'"):
        it.run("forward", [torch.zeros(2, 4)])
