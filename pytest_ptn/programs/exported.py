"""What an ExportedProgram binds (its constants by key, whether a method mutates them, its I/O order), and
its functional form that the reference lowering and the checks read."""

from __future__ import annotations

from typing import Any

from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from pytest_ptn import upstream_noise
from pytest_ptn.content import digest
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
    """(dtype and shape, sha256 of bytes) -> the (method, key) pairs holding that immutable tensor."""
    mutable = mutable_keys(programs)
    groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for method, ep in programs.items():
        for key, use in constants_of(ep).items():
            if key not in mutable:
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
    with upstream_noise.contained():  # torch's own pytree deprecation noise, once per program
        return {m: ep.run_decompositions({}) for m, ep in programs.items()}
