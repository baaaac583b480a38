"""The reference package: one zip holding tensors (safetensors), aliases and per-method bindings.

Layout: ``data.safetensors`` (owners and state), ``aliases.json`` (alias -> owner) and ``bindings.json``
(per method, its graph inputs and outputs in order, each naming a final key). Written to a temporary file
and renamed, so a failed save leaves an existing package intact (P10), and the temporary a killed save
left behind is removed by a later save into the folder; members are sorted and timestamps
fixed, so the same plan gives the same bytes (P9). Reading validates everything it trusts through
:mod:`pytest_ptn.reference.zipdata` and checks the bindings, so a damaged package raises
:class:`~pytest_ptn.reference.zipdata.PackageFormatError` (X2).
"""

from __future__ import annotations

import json
import os
import re
import struct
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pytest_ptn.backend import Entry, PackageView, Reference
from pytest_ptn.instruments.content import tensor_bytes
from pytest_ptn.reference import zipdata
from pytest_ptn.reference.zipdata import PackageFormatError

DATA = "data.safetensors"
ALIASES = "aliases.json"
BINDINGS = "bindings.json"
_EPOCH = (1980, 1, 1, 0, 0, 0)
KIND = "reference package"
MAX_BINDINGS_BYTES = 64 * 1024 * 1024
STALE_TEMPORARY_S = 3600.0
"""A save's temporary not written to for this long was left by a killed save, not by a live one (a live
writer streams into it, which keeps its mtime fresh)."""
# item kind -> the fields it must have, per side of a method's signature (see exported.signature)
_ITEMS: dict[str, dict[str, tuple[str, ...]]] = {
    "inputs": {"user": ("index",), "constant": ("key", "final")},
    "outputs": {"user": (), "state": ("final",), "input": ("index",)},
}


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


_CODES: dict[torch.dtype, str] = {
    getattr(torch, name): code for code, name in zipdata.DTYPE_NAMES.items() if hasattr(torch, name)
}
"""torch dtype -> safetensors dtype code."""


def _safetensors_layout(package: Package) -> tuple[bytes, list[torch.Tensor], int]:
    """The ``data.safetensors`` header (length prefix included), its tensors in data order and the
    member's size.

    Laid out as ``safetensors.torch.save`` lays it out: compact JSON, ``__metadata__`` first, padded with
    spaces to a multiple of 8; data by decreasing element size (so every tensor starts aligned to its
    element), then by name. A package of one dtype is byte for byte what ``save`` returns.
    """
    tensors = sorted(package.tensors.items(), key=lambda kv: (-kv[1].element_size(), kv[0]))
    header: dict[str, Any] = {
        zipdata.SAFETENSORS_METADATA_KEY: {"state_keys": json.dumps(sorted(package.state_keys))}
    }
    offset = 0
    for key, t in tensors:
        if t.dtype not in _CODES:
            raise ValueError(f"constant {key!r}: safetensors cannot store dtype {t.dtype}")
        n = t.numel() * t.element_size()
        header[key] = {"dtype": _CODES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    encoded = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    encoded += b" " * (-len(encoded) % 8)
    prefix = struct.pack("<Q", len(encoded)) + encoded
    return prefix, [t for _, t in tensors], len(prefix) + offset


def write_zip(f: Any, package: Package) -> None:
    """Write ``package`` as a stored zip into the open binary file ``f``: members sorted, timestamps fixed.

    ``data.safetensors`` is streamed a tensor at a time, straight from each tensor's memory (a non-contiguous
    one is copied alone): building the member as one ``bytes`` first, as ``safetensors.torch.save`` does,
    held up to 2x the model. Its size is declared before the first byte, so zipfile decides on zip64 up
    front, exactly as ``writestr`` does with the whole payload in hand.
    """
    prefix, tensors, size = _safetensors_layout(package)
    small = {ALIASES: _json(package.aliases), BINDINGS: _json(package.bindings)}
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
        for name in sorted([DATA, *small]):
            info = zipfile.ZipInfo(name, _EPOCH)
            if name in small:
                z.writestr(info, small[name])
                continue
            info.file_size = size
            with z.open(info, "w") as out:
                out.write(prefix)
                for t in tensors:
                    out.write(tensor_bytes(t.cpu()))


def write_package(path: Path, package: Package) -> None:
    """Write ``package`` to a temporary file next to ``path`` and rename it into place (P10)."""
    remove_stale_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write_zip(f, package)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def remove_stale_temporaries(path: Path) -> None:
    """Remove the temporaries of saves of ``path`` that were killed (not written to for
    :data:`STALE_TEMPORARY_S`): nothing else would ever remove them.

    A temporary of ``path`` is named as :func:`write_package` names it: ``.{name}.`` and mkstemp's 8
    random characters. Best effort: one that cannot be removed (gone already, another owner) is left.
    """
    temporary = re.compile(re.escape(f".{path.name}.") + "[a-z0-9_]{8}")
    cutoff = time.time() - STALE_TEMPORARY_S
    with os.scandir(path.parent) as entries:
        for entry in entries:
            if not temporary.fullmatch(entry.name):
                continue
            try:
                if (
                    entry.is_file(follow_symlinks=False)
                    and entry.stat(follow_symlinks=False).st_mtime < cutoff
                ):
                    os.unlink(entry.path)
            except OSError:
                continue  # removed by a concurrent save, or not ours to remove


def read_package(path: Path) -> Package:
    """Read and validate a reference package; a damaged one raises PackageFormatError (X2)."""
    spath = str(path)
    zf, infos = zipdata.open_zip(path, kind=KIND)
    with zf:
        data = zipdata.read_safetensors(spath, zf, zipdata.require_member(spath, infos, DATA))
        raw_aliases = zipdata.read_member(
            spath, zf, zipdata.require_member(spath, infos, ALIASES), zipdata.MAX_ALIASES_BYTES
        )
        raw_bindings = zipdata.read_member(
            spath, zf, zipdata.require_member(spath, infos, BINDINGS), MAX_BINDINGS_BYTES
        )
    aliases = zipdata.parse_aliases(spath, raw_aliases, data.tensors, member=ALIASES)
    stored = data.tensors.keys() | aliases.keys()
    state_keys = _state_keys(spath, data.metadata, stored)
    bindings = _bindings(spath, raw_bindings, stored)
    return Package(data.tensors, aliases, bindings, state_keys)


def _state_keys(path: str, metadata: dict[str, str], stored: set[str]) -> list[str]:
    """The state keys recorded in the safetensors header metadata; each must have data."""
    try:
        keys = zipdata.loads_json(metadata.get("state_keys", "[]").encode())
    except ValueError as exc:
        raise PackageFormatError(
            path, f"state_keys in the {DATA} metadata is not valid JSON ({exc})"
        ) from exc
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise PackageFormatError(path, f"state_keys in the {DATA} metadata must be a JSON list of strings")
    for key in keys:
        if key not in stored:
            raise PackageFormatError(path, f"state key {key!r} has no data in {DATA}")
    return keys


def _bindings(path: str, raw: bytes, stored: set[str]) -> dict[str, Any]:
    """Per-method signatures: every item well formed, every final name it refers to has data."""
    try:
        obj = zipdata.loads_json(raw)
    except ValueError as exc:
        raise PackageFormatError(path, f"{BINDINGS} is not valid JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise PackageFormatError(path, f"{BINDINGS} must be a JSON object of method -> signature")
    for method, sig in obj.items():
        if not isinstance(sig, dict) or not all(isinstance(sig.get(f), list) for f in ("inputs", "outputs")):
            raise PackageFormatError(
                path, f"{BINDINGS}: method {method!r} must map to an object with 'inputs' and 'outputs' lists"
            )
        for side, kinds in _ITEMS.items():
            for i, item in enumerate(sig[side]):
                _check_item(path, method, f"{side[:-1]} {i}", item, kinds, stored)
    return obj


def _check_item(
    path: str, method: str, where: str, item: object, kinds: dict[str, tuple[str, ...]], stored: set[str]
) -> None:
    def bad(problem: str) -> PackageFormatError:
        return PackageFormatError(path, f"{BINDINGS}: method {method!r} {where} {problem}")

    if not isinstance(item, dict) or item.get("kind") not in kinds:
        raise bad(f"must be an object whose 'kind' is one of {sorted(kinds)}, got {item!r}")
    kind = item["kind"]
    for name in kinds[kind]:
        value = item.get(name)
        ok = (
            isinstance(value, int) and not isinstance(value, bool) and value >= 0
            if name == "index"
            else isinstance(value, str)
        )
        if not ok:
            expected = "a non-negative int" if name == "index" else "a string"
            raise bad(f"({kind}) field {name!r} must be {expected}, got {value!r}")
    if "final" in kinds[kind] and item["final"] not in stored:
        what = f"constant key {item['key']!r}" if kind == "constant" else "mutation target"
        raise bad(f"({what}) refers to final name {item['final']!r}, which has no data in the package")


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
    entries = {name: Entry.of(t) for name, t in package.tensors.items()}
    return PackageView(
        bindings, references, entries, dict(package.aliases), set(package.state_keys), package.tensor
    )


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, indent=1).encode()
