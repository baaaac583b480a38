"""The reference loader: binds each method's constants only from the reference package, by final name.

Each method runs its functional core-ATen graph; immutable constants are shared through a SharingCache and
mutated state is written back after every call.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from pytest_ptn.backend import Loaded, Lowered, MemoryReading, PackageView
from pytest_ptn.instruments.content import SharingCache
from pytest_ptn.reference.inputs import DECLARED_RANGES, CallRefused, InputMeta, call_refusal
from pytest_ptn.reference.package import Package, read_package, view
from pytest_ptn.reference.planner import STATE


class ReferenceLowered(Lowered):
    def __init__(self, path: Path, graphs: dict[str, torch.fx.GraphModule]):
        self.path = path
        self.graphs = graphs

    def package(self) -> PackageView:
        return view(read_package(self.path))


class ReferenceLoaded(Loaded):
    """The reference loader, and a base for a loader of one's own: ``bind`` decides which tensor each
    method's constant gets (sharing through the cache by content), from ``package_tensor`` (the stored
    bytes) and ``allocate`` (the loader's copy, counted for S6). Overriding ``bind`` is the supported way to
    put another binding or cache under the suite (``python -m pytest_ptn new-backend`` writes one)."""

    def __init__(self, package: Package, graphs: dict[str, torch.fx.GraphModule], cache: SharingCache):
        self._package = package
        self._graphs = graphs
        self._cache = cache
        self._state = self._initial_state()
        self._bound: dict[str, dict[str, torch.Tensor]] = {}
        self._allocated = 0
        self._peak = 0

    def _initial_state(self) -> dict[str, torch.Tensor]:
        """A private, writable copy of every state entry: loaded copies never share state (E4)."""
        return {k: self._package.tensor(k).clone() for k in self._package.state_keys}

    def package_tensor(self, final: str) -> torch.Tensor:
        """The package's tensor stored under ``final`` (the host copy, read-only)."""
        return self._package.tensor(final)

    def allocate(self, host: torch.Tensor) -> torch.Tensor:
        """Materialize a constant (this loader's 'device' copy), counting the bytes for S6."""
        self._allocated += host.numel() * host.element_size()
        self._peak = max(self._peak, self._allocated)
        return host.clone()

    def bind(self, method: str, key: str, final: str) -> torch.Tensor:
        """The tensor ``method``'s constant ``key`` (stored as ``final``) runs with, once per method load."""
        return self._cache.share(self.package_tensor(final), self.allocate)

    def _state_tensor(self, method: str, final: str) -> torch.Tensor:
        return self._state[final]

    def _constants(self, method: str) -> list[dict[str, Any]]:
        if method not in self._package.bindings:
            raise KeyError(f"no method {method!r} in package (has {sorted(self._package.bindings)})")
        return [i for i in self._package.bindings[method]["inputs"] if i["kind"] == "constant"]

    def load_method(self, method: str) -> None:
        if method in self._bound:
            return
        self._bound[method] = {
            item["final"]: self.bind(method, item["key"], item["final"])
            for item in self._constants(method)
            if item["final"] not in self._state
        }

    def _tensor(self, method: str, final: str) -> torch.Tensor:
        bound = self._bound[method]
        return bound[final] if final in bound else self._state_tensor(method, final)

    def _admits(self, method: str, inputs: Sequence[torch.Tensor]) -> None:
        """Refuse a call the method was not exported for, as the runtime refuses it (CallRefused)."""
        sig = self._package.bindings[method]
        graph = self._graphs[method]
        placeholders = graph.graph.find_nodes(op="placeholder")
        ranges = graph.meta.get(DECLARED_RANGES)
        metas = [
            InputMeta.of(node.meta["val"], ranges)
            for node, item in zip(placeholders, sig["inputs"], strict=True)
            if item["kind"] == "user" and isinstance(node.meta.get("val"), torch.Tensor)
        ]
        refusal = call_refusal(method, metas, inputs)
        if refusal is not None:
            raise CallRefused(refusal)

    def run(self, method: str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        self.load_method(method)
        self._admits(method, inputs)
        sig = self._package.bindings[method]
        args = [
            inputs[item["index"]] if item["kind"] == "user" else self._tensor(method, item["final"])
            for item in sig["inputs"]
        ]
        with torch.no_grad():
            outs = self._graphs[method](*args)
        results = []
        for item, value in zip(sig["outputs"], outs, strict=True):
            if item["kind"] == "state":
                self._state_tensor(method, item["final"]).copy_(value)
            elif item["kind"] == "input":
                inputs[item["index"]].copy_(value)
            else:
                results.append(value)
        return results

    def storage(self, method: str, key: str) -> int:
        self.load_method(method)
        final = next(i["final"] for i in self._constants(method) if i["key"] == key)
        return self._tensor(method, final).untyped_storage().data_ptr()

    def state(self) -> dict[str, torch.Tensor]:
        return {k.removeprefix(f"{STATE}/"): t for k, t in self._state.items()}

    def constant_memory(self) -> MemoryReading:
        return MemoryReading(self._peak, "reference loader: peak bytes it held for constants")
