"""The reference package: one zip holding tensors (safetensors), aliases and per-method bindings.

Layout: ``data.safetensors`` (owners and state), ``aliases.json`` (alias -> owner) and ``bindings.json``
(per method, its graph inputs and outputs in order, each naming a final key). Written to a temporary file
and renamed, so a failed save leaves an existing package intact (P10); members are sorted and timestamps
fixed, so the same plan gives the same bytes (P9).
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from pytest_ptn.backend import Entry, PackageView, Reference

DATA = "data.safetensors"
ALIASES = "aliases.json"
BINDINGS = "bindings.json"
_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass
class Package:
    tensors: dict[str, torch.Tensor]
    """owner final name -> tensor."""
    aliases: dict[str, str]
    bindings: dict[str, Any]
    """method -> {"inputs": [...], "outputs": [...]}; see backends.reference for the items."""
    state_keys: list[str]

    def tensor(self, name: str) -> torch.Tensor:
        return self.tensors[self.aliases.get(name, name)]


def write_package(path: Path, package: Package) -> None:
    members = {
        DATA: save_safetensors(
            {k: t.detach().contiguous() for k, t in package.tensors.items()},
            metadata={"state_keys": json.dumps(sorted(package.state_keys))},
        ),
        ALIASES: _json(package.aliases),
        BINDINGS: _json(package.bindings),
    }
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
            for name in sorted(members):
                z.writestr(zipfile.ZipInfo(name, _EPOCH), members[name])
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_package(path: Path) -> Package:
    with zipfile.ZipFile(path) as z:
        data = z.read(DATA)
        aliases = json.loads(z.read(ALIASES))
        bindings = json.loads(z.read(BINDINGS))
    tensors = load_safetensors(data)
    header_len = int.from_bytes(data[:8], "little")  # state keys are in the safetensors header metadata
    header = json.loads(data[8 : 8 + header_len])
    state_keys = json.loads(header.get("__metadata__", {}).get("state_keys", "[]"))
    return Package(tensors, aliases, bindings, state_keys)


def view(package: Package) -> PackageView:
    """The P-rule view of a package: every key a method binds or writes is a reference."""
    bindings: dict[str, dict[str, str]] = {}
    references = []
    for method, sig in package.bindings.items():
        bindings[method] = {}
        for item in sig["inputs"]:
            if item["kind"] == "constant":
                bindings[method][item["key"]] = item["final"]
                references.append(Reference(method, "input binding", item["final"]))
        for item in sig["outputs"]:
            if item["kind"] == "state":
                references.append(Reference(method, "mutation target", item["final"]))
    entries = {
        name: Entry(str(t.dtype).removeprefix("torch."), tuple(t.shape), t.numel() * t.element_size())
        for name, t in package.tensors.items()
    }
    return PackageView(
        bindings, references, entries, dict(package.aliases), set(package.state_keys), package.tensor
    )


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, indent=1).encode()
