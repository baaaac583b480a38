"""What an ExportedProgram binds (its constants by key, whether a method mutates them, its I/O order), and
its functional form that the reference lowering and the checks read."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind, OutputKind

from pytest_ptn import upstream_noise
from pytest_ptn.instruments.content import digest
from pytest_ptn.reference.planner import ConstantUse

CONSTANT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def constants_of(ep: ExportedProgram) -> dict[str, ConstantUse]:
    """key (FQN / constant name) -> tensor and whether this program mutates it."""
    sig = ep.graph_signature
    mutated = set(sig.buffers_to_mutate.values())
    out = {}
    for spec in sig.input_specs:
        if spec.kind in CONSTANT_KINDS:
            assert spec.target is not None
            tensor = ep.constants[spec.target] if spec.target in ep.constants else ep.state_dict[spec.target]
            out[spec.target] = ConstantUse(tensor, spec.target in mutated)
    return out


def aliases(ep: ExportedProgram) -> dict[str, str]:
    """key -> the key that stands for the same tensor, for every key that is a second name of one (a submodule
    reachable by several paths, or a tied weight, gives one tensor several FQNs): one tensor is one constant.
    The key standing for it is the first one the graph reads: a loader that allocates only what a method
    reads (AOTI) allocates that one, so an unread name is never the owner while a read one exists."""
    read = read_keys(ep)
    constants = constants_of(ep)
    first: dict[tuple[Any, ...], str] = {}
    out = {}
    for key in sorted(constants, key=lambda k: k not in read):  # stable: read keys first, each in order
        t = constants[key].tensor
        identity = (t.untyped_storage().data_ptr(), t.storage_offset(), t.dtype, tuple(t.shape), t.stride())
        owner = first.setdefault(identity, key)
        if owner != key and t.untyped_storage().nbytes() > 0:
            out[key] = owner
    return out


def read_keys(ep: ExportedProgram) -> set[str]:
    """The constant keys whose placeholders the graph reads: a loader need not allocate the others (a
    module's parameter that this method does not use, a second FQN of one tensor)."""
    used = {n.name for n in ep.graph.find_nodes(op="placeholder") if n.users}
    return {s.target for s in ep.graph_signature.input_specs if s.arg.name in used and s.target is not None}


def mutable_keys(programs: dict[str, ExportedProgram]) -> set[str]:
    return {k for ep in programs.values() for k in ep.graph_signature.buffers_to_mutate.values()}


def signature(ep: ExportedProgram, finals: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """The graph's inputs and outputs in order, each naming a final key, a user input or a user output."""
    sig = ep.graph_signature
    inputs: list[dict[str, Any]] = []
    user_index: dict[str, int] = {}
    for spec in sig.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            user_index[spec.arg.name] = len(user_index)
            inputs.append({"kind": "user", "index": user_index[spec.arg.name]})
        elif spec.kind in CONSTANT_KINDS:
            assert spec.target is not None
            inputs.append({"kind": "constant", "key": spec.target, "final": finals[spec.target]})
        else:
            raise NotImplementedError(f"input kind {spec.kind.name} of {spec.arg}")
    outputs: list[dict[str, Any]] = []
    for out in sig.output_specs:
        if out.kind == OutputKind.BUFFER_MUTATION:
            assert out.target is not None
            outputs.append({"kind": "state", "final": finals[out.target]})
        elif out.kind == OutputKind.USER_INPUT_MUTATION:
            assert out.target is not None
            outputs.append({"kind": "input", "index": user_index[out.target]})
        elif out.kind == OutputKind.USER_OUTPUT:
            outputs.append({"kind": "user"})
        else:
            raise NotImplementedError(f"output kind {out.kind.name} of {out.arg}")
    return {"inputs": inputs, "outputs": outputs}


def immutable_by_content(
    programs: dict[str, ExportedProgram],
) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(dtype and shape, sha256 of bytes) -> the (method, key) pairs holding that immutable tensor, one key
    per tensor (aliases: a second FQN of a tensor is not a second constant)."""
    mutable = mutable_keys(programs)
    groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for method, ep in programs.items():
        second_names = aliases(ep)
        for key, use in constants_of(ep).items():
            if key not in mutable and key not in second_names:
                t = use.tensor
                meta = f"{t.dtype}{tuple(t.shape)}"
                groups.setdefault((meta, digest(t)), []).append((method, key))
    return groups


def unique_immutable_bytes(programs: dict[str, ExportedProgram]) -> int:
    total = 0
    for pairs in immutable_by_content(programs).values():
        method, key = pairs[0]
        t = constants_of(programs[method])[key].tensor
        total += t.numel() * t.element_size()
    return total


def functionalize(
    programs: dict[str, ExportedProgram],
) -> dict[str, ExportedProgram]:
    """Core-ATen functional programs: mutations become outputs listed in the graph signature."""
    return {m: FUNCTIONAL_FORMS.functional(ep) for m, ep in programs.items()}


@dataclass(frozen=True)
class FunctionalForm:
    """What ``run_decompositions({})`` made of a program, without its tensors: the graph depends on the
    program's code and metadata only, so it serves every program that differs from it in constant values
    and in constant names alone (the names of the program it was made from are ``names``)."""

    graph_module: torch.fx.GraphModule
    graph_signature: ExportGraphSignature
    range_constraints: dict[Any, Any]
    module_call_graph: list[Any]
    verifiers: list[Any]
    names: tuple[tuple[str, str], ...]
    """(placeholder, key) of each constant input of the program decomposed, in decomposition's order."""

    def bind(self, ep: ExportedProgram) -> ExportedProgram:
        """This form holding ``ep``'s own tensors under ``ep``'s own names (a private copy of the graph: a
        lowering may rewrite it). Constants correspond by their place in decomposition's order."""
        theirs = decomposed_names(ep)
        placeholders = {mine: their for (mine, _), (their, _) in zip(self.names, theirs, strict=True)}
        keys = {mine: their for (_, mine), (_, their) in zip(self.names, theirs, strict=True)}
        root, graph = private_copy(self.graph_module, placeholders)
        return ExportedProgram(
            root=root,
            graph=graph,
            graph_signature=renamed_signature(self.graph_signature, placeholders, keys),
            state_dict=dict(ep.state_dict),
            range_constraints=copy.deepcopy(self.range_constraints),
            module_call_graph=self.call_graph(ep),
            example_inputs=ep.example_inputs,
            constants=dict(ep.constants),
            verifiers=self.verifiers,
        )

    def call_graph(self, ep: ExportedProgram) -> list[Any]:
        """``ep``'s module call graph with this form's entries where a signature names the graph's nodes:
        decomposition copies the others (a submodule's path, no signature) as they are."""
        signed = {e.fqn: e for e in self.module_call_graph if e.signature is not None}
        return call_graph_copy(
            [signed.get(e.fqn, e) if e.signature is not None else e for e in ep.module_call_graph]
        )


V = TypeVar("V")


class RecentForms(Generic[V]):
    """The forms of the most recent ``size`` keys, the first form made for a key kept; ``lock`` also guards
    the counters of the cache that holds it. ``None`` is a form too: a key known to make none."""

    def __init__(self, size: int):
        self._size = size
        self._forms: OrderedDict[str, V | None] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: str) -> tuple[bool, V | None]:
        """Whether ``key`` is known and its form, marking it recent."""
        with self.lock:
            known = key in self._forms
            if known:
                self._forms.move_to_end(key)
            return known, self._forms.get(key)

    def add(self, key: str, form: V | None) -> None:
        with self.lock:
            self._forms.setdefault(key, form)
            while len(self._forms) > self._size:
                self._forms.popitem(last=False)


class FunctionalForms:
    """Functional forms by a key of everything ``run_decompositions`` reads but tensor values and constant
    names.

    Decomposing costs ~0.2 s per method, mostly torch overriding every CompositeImplicitAutograd op and
    restoring it, whatever the graph's size; a run decomposes the same graph many times over (the suite's
    inspection and each lowering of a scenario, S4's program with other values, P9's second lowering, the
    fuzz test's programs, which differ mostly in names and values, hypothesis shrinking). A form is reused
    only when the decomposed program binds exactly the tensors it was given (same state_dict and constants
    keys), so every tensor of the result is the caller's. ``reused`` and ``decomposed`` count the programs
    served each way."""

    def __init__(self, size: int):
        self._forms: RecentForms[FunctionalForm] = RecentForms(size)
        self.reused = 0
        self.decomposed = 0

    def functional(self, ep: ExportedProgram) -> ExportedProgram:
        key = form_key(ep)
        known, form = self._forms.get(key)
        with self._forms.lock:
            if form is not None:
                self.reused += 1
            else:
                self.decomposed += 1
        if form is not None:
            return form.bind(ep)
        result = decompose(ep)
        if known:
            return result
        same_tensors = set(result.state_dict) == set(ep.state_dict) and set(result.constants) == set(
            ep.constants
        )
        names = decomposed_names(ep)
        # the key's order is torch's, or the form would serve programs it orders otherwise
        same_order = [k for _, k in constant_names(result)] == [k for _, k in names]
        form = (
            FunctionalForm(
                copy.deepcopy(result.graph_module),
                copy.deepcopy(result.graph_signature),
                copy.deepcopy(result.range_constraints),
                call_graph_copy(result.module_call_graph),
                list(result.verifiers),
                tuple(names),
            )
            if same_tensors and same_order
            else None
        )
        self._forms.add(key, form)
        return result


def decompose(ep: ExportedProgram) -> ExportedProgram:
    with upstream_noise.contained():  # torch's own pytree deprecation noise, once per program
        return ep.run_decompositions({})


def constant_names(ep: ExportedProgram) -> list[tuple[str, str]]:
    """(placeholder, key) of each constant input, in the signature's order."""
    return [
        (spec.arg.name, spec.target)
        for spec in ep.graph_signature.input_specs
        if spec.kind in CONSTANT_KINDS and spec.target is not None
    ]


def form_key(ep: ExportedProgram) -> str:
    """sha256 of the code of every graph, every placeholder's metadata, the signature, the shape constraints
    and the calling convention: all ``run_decompositions`` reads of a program besides tensor values. A
    constant counts by its place in the order decomposition gives the constants (``decomposed_order``),
    not by its name nor by its place in the signature: decomposition retraces the program with its
    constants in that order, so programs that differ in constant names, or in the order their signatures
    list them, alone share a key. A name that shows anywhere else (a subgraph's code) still counts as
    itself."""
    order = decomposed_order(ep)
    names = constant_names(ep)
    placeholders = {names[i][0]: f"\0c{j}" for j, i in enumerate(order)}
    keys = {names[i][1]: f"\0k{j}" for j, i in enumerate(order)}
    h = hashlib.sha256()
    for name, module in ep.graph_module.named_modules():
        if isinstance(module, torch.fx.GraphModule):
            code = _substitute(module.code, placeholders) if module is ep.graph_module else module.code
            if module is ep.graph_module:  # the parameter list is the signature's order: hashed below
                code = _PARAMETER_LIST.sub("def forward(self)", code, count=1)
            h.update(f"{name}\0{code}\0".encode())
    by_name = {node.name: node for node in ep.graph.find_nodes(op="placeholder")}
    in_order = [names[i][0] for i in order] + [p for p in by_name if p not in placeholders]
    for name in in_order:
        val = by_name[name].meta.get("val")
        meta = (
            (val.dtype, tuple(val.shape), tuple(val.stride()), val.device, val.requires_grad)
            if isinstance(val, torch.Tensor)
            else (type(val).__name__, val)
        )
        h.update(f"{placeholders.get(name, name)}\0{meta}\0".encode())
    # a submodule's path without a signature is copied through as it is (FunctionalForm.call_graph)
    call = [
        (e.fqn, e.signature.in_spec, e.signature.out_spec)
        for e in ep.module_call_graph
        if e.signature is not None
    ]
    renamed = renamed_signature(ep.graph_signature, placeholders, keys)
    rank = {placeholders.get(p, p): j for j, p in enumerate(in_order)}
    inputs = sorted(renamed.input_specs, key=lambda s: rank.get(getattr(s.arg, "name", ""), len(rank)))
    h.update(f"{inputs}\0{renamed.output_specs}\0{ep.range_constraints}\0{call}\0{ep.dialect}".encode())
    return h.hexdigest()


_PARAMETER_LIST = re.compile(r"def forward\(self, [^)]*\)")


def decomposed_names(ep: ExportedProgram) -> list[tuple[str, str]]:
    """(placeholder, key) of each constant input, in the order decomposition gives them."""
    names = constant_names(ep)
    return [names[i] for i in decomposed_order(ep)]


def decomposed_order(ep: ExportedProgram) -> list[int]:
    """The order ``run_decompositions`` gives ``ep``'s constant inputs, as indices into
    ``constant_names(ep)``: it retraces a module rebuilt from them, whose submodules come into being in the
    order the signature lists the constants (each creating the submodules on its path), and lists its
    parameters and then its buffers module by module, depth first; a constant is registered as a buffer
    after its module's own. Two programs of one graph whose modules group their constants alike get one
    order, whatever the modules' names (matched torch on 408 of 408 drawn methods)."""
    specs = [s for s in ep.graph_signature.input_specs if s.kind in CONSTANT_KINDS and s.target is not None]
    tree: dict[str, Any] = {}
    own: dict[tuple[tuple[str, ...], bool], list[int]] = {}
    for spec in specs:
        node = tree
        for atom in cast(str, spec.target).split(".")[:-1]:
            node = node.setdefault(atom, {})
    for kind in (InputKind.BUFFER, InputKind.PARAMETER, InputKind.CONSTANT_TENSOR):
        for i, spec in enumerate(specs):
            if spec.kind == kind:
                path = tuple(cast(str, spec.target).split(".")[:-1])
                own.setdefault((path, kind == InputKind.PARAMETER), []).append(i)

    def walk(node: dict[str, Any], path: tuple[str, ...], parameter: bool) -> list[int]:
        out = list(own.get((path, parameter), []))
        for atom, child in node.items():
            out += walk(child, (*path, atom), parameter)
        return out

    return walk(tree, (), True) + walk(tree, (), False)


def _substitute(code: str, names: dict[str, str]) -> str:
    if not names:
        return code
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    return pattern.sub(lambda m: names[m.group(1)], code)


def call_graph_copy(module_call_graph: list[Any]) -> list[Any]:
    """A deep copy of an ExportedProgram's module call graph sharing its pytree specs: they are immutable,
    and copying one makes torch warn (a FutureWarning about ``LeafSpec``) from our code, outside any
    backend's contained toolchain calls, which a host's ``filterwarnings = error`` turns into a failure."""
    return copy.deepcopy(module_call_graph, specs_kept(module_call_graph))


def specs_kept(module_call_graph: list[Any]) -> dict[int, Any]:
    """A deep-copy memo that keeps a module call graph's pytree specs (see call_graph_copy)."""
    memo: dict[int, Any] = {}
    for entry in module_call_graph:
        if entry.signature is not None:
            for spec in (entry.signature.in_spec, entry.signature.out_spec):
                memo[id(spec)] = spec
    return memo


def private_copy(
    graph_module: torch.fx.GraphModule, placeholders: dict[str, str]
) -> tuple[torch.fx.GraphModule | dict[str, Any], torch.fx.Graph]:
    """A copy of ``graph_module``'s graph with placeholders renamed ``old -> new``, and the root an
    ExportedProgram of its own takes with it: a lowering may rewrite both. A graph without submodules is
    copied node by node on an empty root and compiled once, by ExportedProgram (a deep copy compiles it
    twice more: copying and renaming cost three times what the copy does); a graph's own metadata is the
    root's (ExportedProgram keeps a GraphModule root's)."""
    if next(graph_module.children(), None) is not None:
        root = copy.deepcopy(graph_module)
        rename_placeholders(root.graph, placeholders)
        return root, root.graph
    graph = torch.fx.Graph()
    value, output = cast(
        "tuple[Any, torch.fx.Node]", graph.graph_copy(graph_module.graph, {}, return_output_node=True)
    )
    graph.output(value, type_expr=output.type).meta = copy.copy(output.meta)
    rename_placeholders(graph, placeholders)
    root = torch.fx.GraphModule({}, torch.fx.Graph())
    root.meta.update(graph_module.meta)
    return root, graph


def rename_placeholders(graph: torch.fx.Graph, names: dict[str, str]) -> None:
    """Rename placeholders ``old -> new`` all at once (``names`` may swap two), as torch's own placeholder
    naming pass does, keeping the graph's namespace in step."""
    nodes = [n for n in graph.find_nodes(op="placeholder") if n.name in names]
    others = {n.name for n in graph.nodes} - set(names)
    taken = others & {names[n.name] for n in nodes}
    if taken:
        raise AssertionError(f"placeholder names {sorted(taken)} are taken in {graph}")
    for node in [(n, names[n.name]) for n in nodes]:
        node[0].name = node[0].target = node[1]
        graph._graph_namespace._rename_object(node[0], node[1])


def renamed_signature(
    signature: ExportGraphSignature, placeholders: dict[str, str], keys: dict[str, str]
) -> ExportGraphSignature:
    """A copy of ``signature`` with placeholder names and constant keys replaced."""

    def arg(a: Any) -> Any:
        name = getattr(a, "name", None)
        return dataclasses.replace(a, name=placeholders[name]) if name in placeholders else copy.copy(a)

    def target(t: str | None) -> str | None:
        return keys.get(t, t) if t is not None else None

    return ExportGraphSignature(
        input_specs=[
            dataclasses.replace(s, arg=arg(s.arg), target=target(s.target)) for s in signature.input_specs
        ],
        output_specs=[
            dataclasses.replace(s, arg=arg(s.arg), target=target(s.target) if s.kind in _KEYED else s.target)
            for s in signature.output_specs
        ],
    )


_KEYED = (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION)
"""Output kinds whose target is a constant's key (a user-input mutation names the input)."""


FUNCTIONAL_FORMS = FunctionalForms(size=512)
"""One per process: the forms hold graphs and metadata, never tensors."""
