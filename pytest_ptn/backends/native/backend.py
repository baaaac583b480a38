"""The ``native`` backend: ExecuTorch's ``to_native`` -> a ``.ptn`` package -> pytest-ptn's interpreter.

The package view reads everything that names a data key in the deserialized program (constant bindings,
quantization keys in every graph and nested graph, non-persistent buffer bindings, mutation targets), so the
P rules see what the package really says. Heavy imports happen inside methods.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_ptn.backend import (
    Availability,
    Backend,
    Capability,
    Entry,
    Loaded,
    Lowered,
    PackageView,
    Reference,
    package_version,
)

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from pytest_ptn.backends.native.interpreter import PtnInterpreter
    from pytest_ptn.backends.native.package import PtnPackage

STATE_PREFIX = "state/"


class NativeLowered(Lowered):
    def __init__(self, path: Path, placeholders: dict[str, dict[str, str]]):
        self.path = path
        self.placeholders = placeholders
        """method -> placeholder name -> the key the exported program gives it."""

    def package(self) -> PackageView:
        from pytest_ptn.backends.native.package import read_ptn

        return package_view(read_ptn(self.path), self.placeholders)


def _quant_keys(meta: Any) -> Iterator[str]:
    scheme = getattr(getattr(meta, "quant", None), "scheme", None)
    for field in ("scale_data_key", "zero_point_data_key"):
        key = getattr(scheme, field, None)
        if key:
            yield key


def package_view(package: PtnPackage, placeholders: dict[str, dict[str, str]]) -> PackageView:
    from executorch.backends.native.serialization import schema

    from pytest_ptn.backends.native.graph import iter_graphs

    bindings: dict[str, dict[str, str]] = {}
    references: list[Reference] = []
    state: set[str] = set()
    for method in package.program.methods:
        names = placeholders.get(method.name, {})
        bound = bindings.setdefault(method.name, {})
        for c in method.constants or []:
            bound[names.get(c.name, c.data_key)] = c.data_key
            references.append(Reference(method.name, "constant binding", c.data_key))
            references += [Reference(method.name, "quantization key", k) for k in _quant_keys(c.meta)]
            if c.mutated:
                state.add(c.data_key)
        for b in method.mutable_buffers or []:
            bound[names.get(b.name, b.fqn)] = b.fqn
            references.append(Reference(method.name, "non-persistent buffer binding", b.fqn))
            state.add(b.fqn)
        for spec in method.output_specs or []:
            if spec.kind == schema.OutputKind.BUFFER_MUTATION:
                references.append(Reference(method.name, "mutation target", spec.target))
        for graph in iter_graphs(method.graph):
            for value in graph.tensor_values or []:
                references += [
                    Reference(method.name, "graph quantization key", k) for k in _quant_keys(value.meta)
                ]
    entries = {key: Entry.of(t) for key, t in package.tensors.items()}
    return PackageView(bindings, references, entries, dict(package.aliases), state, package.tensor)


class NativeLoaded(Loaded):
    def __init__(self, interpreter: PtnInterpreter):
        self._interpreter = interpreter

    def load_method(self, method: str) -> None:
        if method not in self._interpreter.method_names:
            raise KeyError(
                f"no method {method!r} in the package (has {sorted(self._interpreter.method_names)})"
            )

    def run(self, method: str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return list(self._interpreter.run(method, inputs))

    def state(self) -> dict[str, torch.Tensor]:
        return {k.removeprefix(STATE_PREFIX): t for k, t in self._interpreter.state.items()}


class NativeBackend(Backend):
    """ExecuTorch's native lowering as released; its known failures are in expectations/native.toml."""

    name = "native"
    capabilities = frozenset({Capability.PACKAGE, Capability.EXECUTE, Capability.STATE})

    @classmethod
    def availability(cls) -> Availability:
        missing = [m for m in ("torch", "executorch", "safetensors") if importlib.util.find_spec(m) is None]
        if missing:
            return Availability(False, f"missing {', '.join(missing)} (pip install 'pytest-ptn[executorch]')")
        if not _has_to_native():
            return Availability(
                False, f"executorch {package_version('executorch')} has no exir.native (to_native)"
            )
        return Availability(True, versions={d: package_version(d) or "?" for d in ("executorch", "torch")})

    def lower(self, programs: dict[str, ExportedProgram], workdir: Path) -> NativeLowered:
        from executorch.exir.native import to_native

        placeholders = {
            method: {spec.arg.name: spec.target for spec in ep.graph_signature.input_specs if spec.target}
            for method, ep in programs.items()
        }
        path = workdir / "program.ptn"
        to_native(programs).save(str(path))
        return NativeLowered(path, placeholders)

    def load(self, lowered: Lowered) -> NativeLoaded:
        from pytest_ptn.backends.native.interpreter import PtnInterpreter
        from pytest_ptn.backends.native.package import read_ptn

        return NativeLoaded(PtnInterpreter(read_ptn(lowered.path)))


def _has_to_native() -> bool:
    """Whether executorch ships ``exir.native``, looked up on disk: ``find_spec`` of a submodule imports its
    parent packages, and ``executorch.exir`` imports torch (seconds, at plugin start-up)."""
    spec = importlib.util.find_spec("executorch")
    roots = spec.submodule_search_locations if spec else None
    return any(
        (Path(root) / "exir" / name).exists() for root in roots or () for name in ("native", "native.py")
    )
