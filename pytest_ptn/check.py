"""Run the rules on your own multi-method program, outside the catalogue.

    from pytest_ptn.check import check_program

    findings = check_program(model, {"prefill": (tokens,), "decode": (token,)}, backend="native")
    assert not findings, "\\n".join(findings)

``model`` is exported once per method (``getattr(model, name)`` as the forward), freshly for the lowering,
and a deep copy runs eagerly for the expected outputs, state carried across calls as eager does. Findings
name the rule: E2 (lowering or loading failed), E1 (a call differs from eager), and where the backend can
show them P1/P2 (namespaces in the package) and S2 (storage shared between different tensors).
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from pytest_ptn.backend import Backend, Capability, resolve_backend
from pytest_ptn.programs.exported import constants_of, functionalize, immutable_by_content, mutable_keys


class _Method(torch.nn.Module):
    """One method of a model as the forward of a module that holds the model (so FQNs stay the model's)."""

    def __init__(self, model: torch.nn.Module, name: str):
        super().__init__()
        self.model = model
        self.method = name

    def forward(self, *args: Any) -> Any:
        return getattr(self.model, self.method)(*args)


def export_methods(
    model: torch.nn.Module, methods: Mapping[str, tuple[Any, ...]]
) -> dict[str, torch.export.ExportedProgram]:
    """Fresh ExportedPrograms, one per method, all holding one deep copy of ``model``."""
    fresh = copy.deepcopy(model)
    return {
        name: torch.export.export(_Method(fresh, name), args, strict=False) for name, args in methods.items()
    }


def _flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    return []


def check_program(
    model: torch.nn.Module,
    methods: Mapping[str, tuple[Any, ...]],
    calls: Sequence[tuple[str, tuple[Any, ...]]] | None = None,
    backend: str | Backend = "reference",
    workdir: Path | None = None,
) -> list[str]:
    """Lower ``model``'s ``methods`` (name -> example inputs) through ``backend`` and check it; [] if clean.

    ``calls`` is the call sequence (method, inputs); by default each method once with its example inputs.
    """
    if isinstance(backend, str):
        backend = resolve_backend(backend)()
    sequence = list(calls) if calls is not None else list(methods.items())
    with tempfile.TemporaryDirectory() as tmp:
        try:
            lowered = backend.lower(export_methods(model, methods), workdir or Path(tmp))
            loaded = backend.load(lowered)
            for name in methods:
                loaded.load_method(name)
        except Exception as e:
            return [f"E2: lowering or loading failed: {type(e).__name__}: {e}"]
        findings = _compare_with_eager(model, sequence, loaded)
        inspected = functionalize(export_methods(model, methods))
        if Capability.PACKAGE in backend.capabilities:
            findings += _namespaces(lowered.package().bindings, inspected)
        if Capability.STORAGE in backend.capabilities:
            findings += _shared_differing(loaded, inspected)
    return findings


def _compare_with_eager(model: torch.nn.Module, sequence: list, loaded: Any) -> list[str]:
    eager = copy.deepcopy(model)
    findings = []
    with torch.no_grad():
        for i, (name, args) in enumerate(sequence):
            want = _flat(getattr(eager, name)(*copy.deepcopy(args)))
            have = loaded.run(name, list(copy.deepcopy(args)))
            if len(have) != len(want):
                findings.append(f"E1: call #{i} {name}(): {len(have)} outputs, eager gives {len(want)}")
                continue
            for j, (w, h) in enumerate(zip(want, have, strict=True)):
                if h.shape != w.shape or not torch.allclose(h.to(w.dtype), w, rtol=1e-5, atol=1e-5):
                    findings.append(f"E1: call #{i} {name}(): output {j} differs from eager")
    return findings


def _namespaces(bindings: dict[str, dict[str, str]], programs: dict) -> list[str]:
    mutable = mutable_keys(programs)
    findings = []
    for method, ep in programs.items():
        for key in constants_of(ep):
            want = f"state/{key}" if key in mutable else f"{method}/{key}"
            got = bindings.get(method, {}).get(key)
            if got != want:
                findings.append(
                    f"{'P2' if key in mutable else 'P1'}: method {method!r} key {key!r} -> {got!r}"
                )
    return findings


def _shared_differing(loaded: Any, programs: dict) -> list[str]:
    owner: dict[int, tuple[tuple[str, str], Any]] = {}
    findings = []
    for content, pairs in immutable_by_content(programs).items():
        for method, key in pairs:
            storage = loaded.storage(method, key)
            first = owner.setdefault(storage, ((method, key), content))
            if first[1] != content:
                findings.append(f"S2: {method}:{key!r} shares storage with {first[0][0]}:{first[0][1]!r}")
    return findings
