"""A repro bundle's standalone reproducer: one Python file that needs torch and executorch only, for the
upstream maintainer who will not install pytest-ptn to read a report.

It holds the program as plain ``nn.Module`` code (what pytest_ptn.programs.build makes of a ProgramSpec,
written out: every constant's and input's value exact, never a seed), exports and lowers it with the calls,
passes and flags of the backend that failed, runs the calls through ``executorch.runtime`` under both load
schedules beside eager, prints every wrong value, and exits 1 while there is one. Only the ``.pte`` backends
have a lowering that fits in such a file; any other gets a one-line reason instead.
"""

from __future__ import annotations

import base64
import keyword
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_ptn.backends.pte import ExternalConstantsBackend, PteBackend, SharedStateBackend, XnnpackBackend
from pytest_ptn.spec import Constant, Method, ProgramSpec, Scenario

if TYPE_CHECKING:
    import torch

    from pytest_ptn.backend import Backend

FILE = "standalone.py"


@dataclass(frozen=True)
class Recipe:
    """How a ``.pte`` backend lowers, as source: what ``PteBackend.lower`` passes for that backend."""

    imports: tuple[str, ...] = ()
    partitioners: str = "[]"
    passes: str = "[]"
    config: str = "ExecutorchBackendConfig()"
    external_data: bool = False


RECIPES: dict[type, Recipe] = {
    PteBackend: Recipe(),
    XnnpackBackend: Recipe(
        ("from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner",),
        partitioners="[XnnpackPartitioner()]",
    ),
    ExternalConstantsBackend: Recipe(
        config="ExecutorchBackendConfig(external_constants=True)", external_data=True
    ),
    SharedStateBackend: Recipe(
        (
            "from executorch.exir.passes import MemoryPlanningPass",
            "from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass",
        ),
        passes='[InitializedMutableBufferPass([""])]',
        config="ExecutorchBackendConfig(\n"
        "        memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True),\n"
        "        emit_mutable_buffer_names=True,\n"
        "    )",
    ),
}
"""Keyed by the exact class: a subclass (a third-party runtime of .pte files) lowers or runs otherwise."""


def reason(backend: Backend, scenario: object) -> str | None:
    """Why a failing case gets no standalone reproducer; None when it gets one."""
    if not isinstance(scenario, Scenario):
        return "a user program is code, not a ProgramSpec to write out"
    if not scenario.valid:
        return "a correct backend rejects this program: there is no wrong value to show"
    if type(backend) not in RECIPES:
        return f"{backend.name} does not lower and run as the executorch .pte backends do"
    return None


def line(folder: Path, why: str | None) -> str:
    """What a failure and the bundle's manifest say of the reproducer: where it is, or why there is none."""
    if why is not None:
        return f"no standalone reproducer: {why}"
    return f"standalone reproducer (torch and executorch only): python {folder / FILE}"


def write(folder: Path, backend: Backend, name: str, spec: ProgramSpec) -> None:
    """``folder/standalone.py`` for ``spec`` failing on ``backend``, a backend of RECIPES."""
    (folder / FILE).write_text(source(RECIPES[type(backend)], backend.name, name, spec))


def source(recipe: Recipe, backend: str, name: str, spec: ProgramSpec) -> str:
    """The reproducer's text."""
    from pytest_ptn.programs.build import Program

    program = Program(spec)
    writer = _Writer(spec)
    classes = [writer.shared_class(), *(writer.method_class(m) for m in spec.methods)]
    calls = ",\n".join(
        f"    ({method!r}, {writer.tensor(program.example_inputs(method, i)[0])})"
        for i, method in enumerate(spec.call_sequence)
    )
    built = ", ".join(f"{m.name!r}: {writer.classes[m.name]}(shared).eval()" for m in spec.methods)
    shapes = ", ".join(f"{m.name!r}: {m.input_shape}" for m in spec.methods)
    wide = spec.dtype != "float32"
    mutating = {m.name for m in spec.methods if m.mutates_input}
    helpers = [_WEIGHTED_SUM] if not spec.vectors else []
    helpers += [_DECODE] if writer.decoded else []
    helpers += [_PLACE] if writer.placed else []
    helpers += [_LAYOUTS[layout] for layout in sorted(writer.layouts)]
    imports = ["import base64"] if writer.decoded else []
    quantize = (
        ["from torchao.quantization import Int8WeightOnlyConfig, quantize_"] if writer.quantized else []
    )
    data = "\n    et.write_tensor_data_to_file(str(folder))" if recipe.external_data else ""
    load = (
        'Runtime.get().load_program(folder / "program.pte", data_path=next(folder.glob("*.ptd")))'
        if recipe.external_data
        else 'Runtime.get().load_program(folder / "program.pte")'
    )
    return _TEMPLATE.format(
        backend=backend,
        name=name,
        imports="\n".join([*imports, "import sys", "import tempfile", "from pathlib import Path"]),
        third_party="\n".join(
            [
                "import torch",
                *sorted(
                    [
                        *quantize,
                        *recipe.imports,
                        "from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower",
                        "from executorch.runtime import Runtime",
                        "from torch import nn",
                    ]
                ),
            ]
        ),
        helpers="".join(f"\n\n\n{h}" for h in helpers),
        classes="\n\n\n".join(classes),
        built=built,
        shapes=shapes,
        dtype=spec.dtype,
        calls=calls,
        mutating="{" + ", ".join(map(repr, sorted(mutating))) + "}" if mutating else "set()",
        passes=recipe.passes,
        partitioners=recipe.partitioners,
        config=recipe.config,
        data=data,
        load=load,
        wide_build=_WIDE_BUILD if wide else "",
        wide_run=_WIDE_RUN if wide else "",
        wide_arg="wide[j]" if wide else "None",
    )


class _Writer:
    """The program's modules as source, one class per method, as pytest_ptn.programs.build builds them."""

    def __init__(self, spec: ProgramSpec):
        self.spec = spec
        self.decoded = False
        self.quantized = False
        every = [*spec.shared, *(c for m in spec.methods for c in m.constants)]
        self.placed = any("." in c.name or c.tied is not None for c in every if c.family not in _IN_FORWARD)
        """Whether a constant sits on a nested module or is tied: its lines ``place`` it at its path."""
        self.layouts = {c.layout for c in every if c.layout != "contiguous" and c.tied is None}
        names = [re.sub(r"\W", "_", m.name) for m in spec.methods]
        names = [n[:1].upper() + n[1:] for n in names]
        fit = len(set(names)) == len(names) and all(
            n.isidentifier() and not keyword.iskeyword(n) and n != "Shared" for n in names
        )
        self.classes = {
            m.name: n if fit else f"Method{i}"
            for i, (m, n) in enumerate(zip(spec.methods, names, strict=True))
        }

    def tensor(self, t: torch.Tensor) -> str:
        """``t`` exactly: a literal where its elements round-trip through Python numbers, else its bytes."""
        import torch

        dtype = f"torch.{str(t.dtype).removeprefix('torch.')}"
        again = torch.tensor(t.tolist(), dtype=t.dtype)
        if t.numel() <= 16 and _bytes(again) == _bytes(t):
            return f"torch.tensor({t.tolist()!r}, dtype={dtype})"
        self.decoded = True
        encoded = base64.b64encode(_bytes(t)).decode()
        return f'tensor("{encoded}", {dtype}, {tuple(t.shape)})'

    def register(self, c: Constant) -> list[str]:
        """The lines of ``__init__`` that give the module constant ``c``, as build._register does."""
        from pytest_ptn.programs.build import make_tensor

        if self.placed and c.family in ("parameter", "buffer", "attribute"):
            return [self.place(c)]
        value = self.tensor(make_tensor(c))
        if c.family == "parameter":
            return [f"self.{c.name} = nn.Parameter({value}, requires_grad=False)"]
        if c.family == "buffer":
            persistent = "" if c.persistent else ", persistent=False"
            return [f'self.register_buffer("{c.name}", {value}{persistent})']
        if c.family == "attribute":
            return [f"self.{c.name} = {value}"]
        if c.family == "int8_linear":
            return [
                f"self.{c.name} = nn.Linear({c.shape[1]}, {c.shape[0]}, bias=False)",
                f"self.{c.name}.weight.data = {value}.to(torch.float32)",
            ]
        if c.family == "linear":
            bias = self.tensor(make_tensor(replace(c, shape=c.shape[:1], seed=c.seed + 1)))
            return [
                f"self.{c.name} = nn.Linear({c.shape[1]}, {c.shape[0]}, dtype=torch.{c.dtype})"
                ".requires_grad_(False)",
                f"self.{c.name}.weight.copy_({value})",
                f"self.{c.name}.bias.copy_({bias})",
            ]
        return []  # a literal or scalar is made in forward

    def place(self, c: Constant) -> str:
        """``place(self, path, tensor, family)``: the tensor laid out as ``c.layout`` says (a tied one, its
        source's tensor, transposed where it says so), at ``c``'s path."""
        from pytest_ptn.programs.build import make_tensor

        if c.tied is not None:
            source = f"get(self, {c.tied!r})"
            value = f"{source}.transpose(-2, -1)" if c.layout == "transposed" else source
        else:
            value = self.tensor(make_tensor(c))
            value = value if c.layout == "contiguous" else f"{c.layout}({value})"
        persistent = "" if c.persistent else ", persistent=False"
        return f"place(self, {c.name!r}, {value}, {c.family!r}{persistent})"

    def quantize(self, constants: tuple[Constant, ...]) -> list[str]:
        names = {c.name for c in constants if c.family == "int8_linear"}
        if not names:
            return []
        self.quantized = True
        return [f"quantize_(self, Int8WeightOnlyConfig(), filter_fn=lambda m, fqn: fqn in {names!r})"]

    def shared_class(self) -> str:
        shared = _registered(self.spec.shared)
        body = [line for c in shared for line in self.register(c)] + self.quantize(self.spec.shared)
        return _init("Shared", "self", body)

    def method_class(self, m: Method) -> str:
        body = ["self.shared = shared"]
        if self.spec.shared_alias is not None:
            body.append(f"self.{self.spec.shared_alias} = shared")
        body += [line for c in _registered(m.constants) for line in self.register(c)]
        body += self.quantize(m.constants)
        if m.branch is not None:
            body += self.register(m.branch.on_true) + self.register(m.branch.on_false)
        forward = self.vectors(m) if self.spec.vectors else self.sums(m)
        return (
            _init(self.classes[m.name], "self, shared", body, f'"""{m.name}()"""')
            + "\n\n    def forward(self, x):\n"
            + "".join(f"        {line}\n" for line in forward).rstrip("\n")
        )

    def constant(self, m: Method, name: str) -> Constant:
        c = m.private(name) or self.spec.shared_constant(name)
        assert c is not None
        return c

    def ref(self, m: Method, name: str) -> str:
        """What reading constant ``name`` is in ``m``'s forward (build.MethodModule._tensor)."""
        from pytest_ptn.programs.build import make_tensor

        c = self.constant(m, name)
        if c.family == "literal":
            return f"torch.tensor({make_tensor(c).tolist()!r}, dtype=torch.{c.dtype})"
        if c.family == "scalar":
            return f"(x.sum() + {make_tensor(c).tolist()!r})"
        owner = "self" if m.private(name) else "self.shared"
        got = f"get({owner}, {name!r})" if self.placed else f"{owner}.{name}"
        return f"{got}(x)" if c.family in ("int8_linear", "linear") else got

    def sums(self, m: Method) -> list[str]:
        lines = ["x.add_(1.0)"] if m.mutates_input else []
        lines.append("xs = x.sum()")
        for w in m.writes:
            lines.append(f"buf = {self.ref(m, w.target)}")
            if w.op == "add":
                lines.append("buf.add_(xs.to(buf.dtype))")
            elif w.op == "copy":
                lines.append("buf.copy_(xs.expand(buf.shape))")
            else:
                lines.append("row = (torch.argmax(x) % buf.shape[0]).reshape(1)")
                lines.append("buf.index_copy_(0, row, x.reshape(1, -1).to(buf.dtype))")
        terms = [f"weighted_sum({self.ref(m, name)}, x.dtype) + xs" for name in m.reads]
        if m.branch is not None:
            lines += [
                f"true_t, false_t = self.{m.branch.on_true.name}, self.{m.branch.on_false.name}",
                "",
                "def on_true(v):",
                "    return v + true_t",
                "",
                "def on_false(v):",
                "    return v - false_t",
                "",
            ]
            terms.append("weighted_sum(torch.cond(xs > 0, on_true, on_false, (x,)), x.dtype)")
        return [*lines, f"return torch.stack([{', '.join(terms or ['xs'])}])"]

    def vectors(self, m: Method) -> list[str]:
        lines: list[str] = []
        for w in m.writes:
            lines.append(f"buf = {self.ref(m, w.target)}")
            lines.append("buf.copy_(torch.cat((buf[1:], x.to(buf.dtype)), 0))")
        terms: list[str] = []
        for name in m.reads:
            t = self.ref(m, name)
            linear = self.constant(m, name).family == "linear"
            terms.append(f"{t}.reshape(-1)" if linear else f"({t} * x).sum(-1)")
        return [*lines, f"return torch.cat([{', '.join(terms)}])" if terms else "return x.reshape(-1)"]


_IN_FORWARD = ("literal", "scalar")
"""The families made in ``forward``, at no path."""


def _registered(constants: tuple[Constant, ...]) -> list[Constant]:
    """In the order build registers them: a tied one after its source."""
    return sorted(constants, key=lambda c: c.tied is not None)


def _init(name: str, args: str, body: list[str], doc: str | None = None) -> str:
    head = f"class {name}(nn.Module):\n" + (f"    {doc}\n\n" if doc else "")
    lines = ["super().__init__()", *body]
    return head + f"    def __init__({args}):\n" + "\n".join(f"        {line}" for line in lines)


def _bytes(t: torch.Tensor) -> bytes:
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


_WEIGHTED_SUM = '''def weighted_sum(t, dtype):
    """Position-weighted sum: any change of a tensor's bytes, or order, changes it."""
    flat = t.to(dtype).reshape(-1)
    return (flat * torch.arange(1, flat.numel() + 1, dtype=dtype)).sum()'''

_DECODE = '''def tensor(data, dtype, shape):
    """A tensor from its bytes (little-endian), base64-encoded."""
    return torch.frombuffer(bytearray(base64.b64decode(data)), dtype=dtype).reshape(shape)'''

_PLACE = '''def place(module, path, tensor, family, persistent=True):
    """Put ``tensor`` at the dotted ``path`` of ``module`` (submodules made as needed), as a parameter, a
    buffer or a plain attribute."""
    *modules, leaf = path.split(".")
    for name in modules:
        if name not in module._modules:
            module.add_module(name, nn.Module())
        module = module._modules[name]
    if family == "parameter":
        param = tensor if isinstance(tensor, nn.Parameter) else nn.Parameter(tensor, requires_grad=False)
        module.register_parameter(leaf, param)
    elif family == "buffer":
        module.register_buffer(leaf, tensor, persistent=persistent)
    else:
        object.__setattr__(module, leaf, tensor)


def get(module, path):
    """What ``module`` holds at the dotted ``path``."""
    for name in path.split("."):
        module = getattr(module, name)
    return module'''

_LAYOUTS = {
    "transposed": '''def transposed(value):
    """``value``, its last two dimensions swapped in memory (strides swapped)."""
    return value.transpose(-2, -1).contiguous().transpose(-2, -1)''',
    "strided": '''def strided(value):
    """``value`` as every other element of a storage twice as long in its last dimension."""
    beside = ~value if value.dtype == torch.bool else value + 1
    return torch.stack((value, beside), -1).reshape(*value.shape[:-1], 2 * value.shape[-1])[..., ::2]''',
    "offset": '''def offset(value):
    """``value`` as a slice starting past other values of its storage."""
    beside = ~value if value.dtype == torch.bool else value + 1
    return torch.cat((beside.reshape(-1), value.reshape(-1)))[value.numel() :].view(value.shape)''',
}
"""The layouts of pytest_ptn.spec.LAYOUTS, as build.held lays them out, written out."""

_WIDE_BUILD = """
    widened = build()
    for module in widened.values():
        module.to(torch.float64)"""

_WIDE_RUN = """
            wx = x.double()
            wide = [widened[name](wx)]
            wide = ([wx] if name in MUTATES_INPUT else []) + wide"""

_TEMPLATE = '''"""{backend} x {name}: a reproducer written by pytest-ptn that needs torch and executorch only.

The program is the modules below, one per method, sharing the root `Shared`. It is exported with
torch.export and lowered as {backend} lowers it, then its calls run through executorch.runtime beside
eager, under both load schedules (each method loaded at its first call, and every method loaded up front).
Every wrong value is printed with eager's, and every error the runtime raises at a load or a call; the exit
status is 1 while there is one, 0 once fixed.
"""

{imports}

{third_party}{helpers}


{classes}


def build():
    """The program's modules: one per method, all holding one `Shared` root."""
    shared = Shared()
    return {{{built}}}


INPUT_SHAPES = {{{shapes}}}
MUTATES_INPUT = {mutating}
"""Methods that return their mutated input as their first output."""
CALLS = [
{calls},
]


def lower(folder):
    programs = {{}}
    for name, module in build().items():
        example = torch.zeros(INPUT_SHAPES[name], dtype=torch.{dtype})
        programs[name] = torch.export.export(module, (example,), strict=False)
    edge = to_edge_transform_and_lower(
        programs,
        transform_passes={passes},
        partitioner={{name: {partitioners} for name in programs}},
    )
    config = {config}
    et = edge.to_executorch(config)
    (folder / "program.pte").write_bytes(et.buffer){data}


def close(have, want, wide):
    """Elementwise within the bound pytest-ptn compares with: 1e-5 absolute and relative, twice the dtype's
    rounding, and for bf16 or fp16 twice eager's own distance from its float64 run."""
    h, e = have.double(), want.double()
    bound = 1e-5 * (1 + e.abs()) + 2 * torch.finfo(want.dtype).eps * e.abs()
    if wide is not None:
        noise = (e - wide.double())[e.isfinite() & wide.isfinite()]
        bound = bound + (2 * noise.abs().max() if noise.numel() else 0)
    return (((h - e).abs() <= bound) & h.isfinite() & e.isfinite()) | (h == e) | (h.isnan() & e.isnan())


def run(folder, up_front):
    """The calls on a fresh load of the program and on fresh eager modules; how many values differ."""
    print("every method loaded up front:" if up_front else "each method loaded at its first call:")
    program = {load}
    methods = {{}}
    eager = build(){wide_build}
    wrong = 0
    with torch.no_grad():
        for i, (name, x) in enumerate(CALLS):
            try:
                for method in INPUT_SHAPES if up_front else [name]:
                    if method not in methods:
                        methods[method] = program.load_method(method)
                have = list(methods[name].execute([x.clone()]))
            except RuntimeError as e:  # the runtime's error codes
                print(f"  call #{{i}} {{name}}(): {{e}}")
                return wrong + 1
            given = x.clone()
            want = [eager[name](given)]
            want = ([given] if name in MUTATES_INPUT else []) + want{wide_run}
            if len(have) != len(want):
                print(f"  call #{{i}} {{name}}(): {{len(have)}} outputs, eager gives {{len(want)}}")
                wrong += 1
                continue
            for j, (h, w) in enumerate(zip(have, want)):
                at = f"  call #{{i}} {{name}}() output {{j}}"
                if h.shape != w.shape:
                    print(f"{{at}}: shape {{tuple(h.shape)}}, eager {{tuple(w.shape)}}")
                    wrong += 1
                    continue
                ok = close(h, w, {wide_arg}).reshape(-1)
                for k in (~ok).nonzero().reshape(-1).tolist():
                    value, eager_value = h.reshape(-1)[k].item(), w.reshape(-1)[k].item()
                    print(f"{{at}}[{{k}}] = {{value!r}}, eager {{eager_value!r}}")
                    wrong += 1
    return wrong


def main():
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        lower(folder)
        wrong = run(folder, up_front=False) + run(folder, up_front=True)
    print(f"{{wrong}} differences from eager: the bug is there" if wrong else "all match eager: fixed")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
'''
