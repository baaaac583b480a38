"""Prototypes of the fixes the benchmarks suggest for pytest_ptn, so their gain is measured, not guessed.

Nothing here is used by pytest_ptn; each function names the code it would replace. They produce and read the
same package format (``read_package`` accepts what ``write_package_streaming`` writes: checked by
``python benchmarks/packaging.py --quick``).
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pytest_ptn import package, rules, zipdata

# safetensors dtype codes (as safetensors.torch writes them)
_CODES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def memoized_digest(digest: Callable[[torch.Tensor], str]) -> Callable[[torch.Tensor], str]:
    """Fix 1 (rules.plan_package): hash each storage range once, however many (method, key) pairs use it.

    plan_package calls ``digest`` once per final name, so a weight shared by M methods is hashed M times.
    Keyed by what decides the bytes (storage, offset, shape, strides, dtype, version counter); the tensor is
    kept alive for the plan, so an address is never reused while its entry exists.
    """
    memo: dict[tuple[object, ...], tuple[torch.Tensor, str]] = {}

    def cached(t: torch.Tensor) -> str:
        key = (
            t.untyped_storage().data_ptr(),
            t.storage_offset(),
            tuple(t.shape),
            t.stride(),
            t.dtype,
            t._version,
        )
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = (t, digest(t))
        return hit[1]

    return cached


def write_package_streaming(path: Path, pkg: package.Package) -> None:
    """Fix 2 (package.members / write_package): stream data.safetensors into the zip a tensor at a time.

    ``safetensors.torch.save`` returns the whole file as one ``bytes`` (and briefly holds it twice: the Rust
    buffer and the Python copy), so writing a package costs 2x the model in memory. Here the header is written
    by hand and each tensor's bytes go straight from its storage into the zip entry: no copy of the model.
    Same members, same sorted order, same fixed timestamps, same atomic rename.
    """
    header: dict[str, Any] = {"__metadata__": {"state_keys": json.dumps(sorted(pkg.state_keys))}}
    tensors = {k: pkg.tensors[k].detach().contiguous() for k in sorted(pkg.tensors)}
    offset = 0
    for key, t in tensors.items():
        n = t.numel() * t.element_size()
        header[key] = {"dtype": _CODES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    encoded = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    encoded += b" " * (-len(encoded) % 8)
    small = {package.ALIASES: package._json(pkg.aliases), package.BINDINGS: package._json(pkg.bindings)}

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
            for name in sorted([package.DATA, *small]):
                info = zipfile.ZipInfo(name, package._EPOCH)
                if name != package.DATA:
                    z.writestr(info, small[name])
                    continue
                info.file_size = 8 + len(encoded) + offset  # lets zipfile pick zip64 up front
                with z.open(info, "w") as out:
                    out.write(len(encoded).to_bytes(8, "little"))
                    out.write(encoded)
                    for t in tensors.values():
                        out.write(rules.tensor_bytes(t))
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_package_direct(path: Path) -> package.Package:
    """Fix 3 (zipdata.read_safetensors): read each tensor straight into its own storage.

    ``read_safetensors`` reads the whole member into one ``bytes`` and then ``safetensors.torch.load`` copies
    every tensor out of it: 2x the package at the peak. Here the header is validated the same way, then each
    tensor is allocated and filled from the member in turn (one tensor's worth of transient bytes), and the
    zip CRC is still checked at the end of the member.
    """
    spath = str(path)
    zf, infos = zipdata.open_zip(path, kind=package.KIND)
    with zf:
        info = zipdata.require_member(spath, infos, package.DATA)
        with zf.open(info) as stream:
            (header_len,) = struct.unpack("<Q", stream.read(8))
            if header_len > min(info.file_size - 8, zipdata.MAX_HEADER_BYTES):
                raise zipdata.PackageFormatError(spath, f"absurd safetensors header length {header_len}")
            header = zipdata.loads_json(stream.read(header_len))
            entries = zipdata.parse_safetensors_header(
                spath, header, info.file_size - 8 - header_len, package.DATA
            )
            tensors: dict[str, torch.Tensor] = {}
            for e in sorted(entries, key=lambda e: e.begin):
                t = torch.empty(e.shape, dtype=getattr(torch, zipdata.DTYPE_NAMES[e.dtype]))
                if e.end > e.begin:
                    t.reshape(-1).view(torch.uint8).numpy()[:] = memoryview(stream.read(e.end - e.begin))
                tensors[e.key] = t
            if stream.read(1):  # at EOF zipfile checks the CRC
                raise zipdata.PackageFormatError(spath, "trailing bytes after the safetensors data")
        raw_aliases = zipdata.read_member(
            spath, zf, zipdata.require_member(spath, infos, package.ALIASES), zipdata.MAX_ALIASES_BYTES
        )
        raw_bindings = zipdata.read_member(
            spath, zf, zipdata.require_member(spath, infos, package.BINDINGS), package.MAX_BINDINGS_BYTES
        )
    aliases = zipdata.parse_aliases(spath, raw_aliases, tensors, member=package.ALIASES)
    stored = tensors.keys() | aliases.keys()
    metadata = dict(header.get(zipdata.SAFETENSORS_METADATA_KEY) or {})
    state_keys = package._state_keys(spath, metadata, stored)
    bindings = package._bindings(spath, raw_bindings, stored)
    return package.Package(tensors, aliases, bindings, state_keys)


class KeyMemoCache(rules.SharingCache):
    """Fix 4 (rules.SharingCache.share / loader.ReferenceLoaded._bind): compute a host tensor's ContentKey
    once. Every alias of a package owner resolves to the same host tensor, so the reference loader re-hashes
    a weight shared by M methods M times (and again in every later load of the same package)."""

    def __init__(self) -> None:
        super().__init__()
        self._keys: dict[int, tuple[torch.Tensor, int, rules.ContentKey]] = {}

    def share(
        self, host: torch.Tensor, materialize: Callable[[torch.Tensor], torch.Tensor] = torch.clone
    ) -> torch.Tensor:
        memo = self._keys.get(id(host))
        if memo is None or memo[0] is not host or memo[1] != host._version:
            memo = self._keys[id(host)] = (host, host._version, rules.ContentKey.of(host))
        key = memo[2]
        cached = self._tensors.get(key)
        if cached is None:
            cached = self._tensors[key] = materialize(host)
            self.materialized_bytes += cached.untyped_storage().nbytes()
        return cached
