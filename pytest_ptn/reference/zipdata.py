"""Validated reading of zip packages that hold safetensors data and an alias map (rule X2).

Both package formats this project reads (the reference package of :mod:`pytest_ptn.reference.package` and the
native ``.ptn`` of :mod:`pytest_ptn.backends.native.package`) are *uncompressed* zips holding a
``*.safetensors`` member (owners only) and an ``aliases.json`` member (``{alias: owner}``). This module checks
every size it is about to trust *before* allocating for it:

* :func:`open_zip`: the zip central directory (member spans inside the archive, members stored
  uncompressed so none can inflate past the archive's size, no duplicate members, no member path
  escaping the package folder, no zip feature that zipfile does not implement);
* :func:`read_member`: one member, with a cap on its declared size and the CRC verified;
* :func:`read_safetensors`: the 8-byte header length (against the member size and a cap), the header
  JSON, the number of tensors, each tensor's dtype, shape (which torch must be able to describe, even
  when empty) and data offsets (which must tile the data section), and only then the tensors, each read
  straight into its own storage;
* :func:`parse_aliases`: the alias map (an object of str -> str, every alias naming an existing owner,
  no cycle, no alias of an alias, no key both owner and alias), in time linear in its size.

Every problem raises :class:`PackageFormatError` (a ``ValueError``) whose message is
``"<path>: <problem>"`` and names the member/key involved. Importing this module needs neither torch nor
executorch.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zipfile
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ALIASES_MEMBER = "aliases.json"
SAFETENSORS_METADATA_KEY = "__metadata__"

#: The safetensors library refuses headers above 100 MB; so do we.
MAX_HEADER_BYTES = 100_000_000
MAX_ALIASES_BYTES = 16 * 1024 * 1024
MAX_MEMBERS = 64
MAX_RANK = 64
MAX_TENSORS = 100_000
"""Tensors in one safetensors member, a generous bound: it caps the work (a parsed entry and a tensor each)
that zero-byte entries, free in the data section, would otherwise cost (about a second and 80 MiB at the
cap, however long the header)."""
MAX_TENSOR_SPAN = 2**63 - 1
"""Bytes a tensor's dimensions may span, a zero dimension counted as one: torch describes every tensor,
even an empty one, with int64 strides and storage size, and fails on a shape past this."""
UNSUPPORTED_FLAG_BITS = {0x20: "compressed patched data", 0x40: "strong encryption"}
"""Zip general purpose flag bits a package never sets, beyond encryption (0x1): zipfile cannot read a
member that has them."""
ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    NotImplementedError,
    EOFError,
    ValueError,
    OSError,
    struct.error,
)
"""What zipfile raises on a corrupt archive, or on one using a feature it does not implement (a version
needed to extract above 6.3, patched data, strong encryption, an unknown compression method)."""

# safetensors dtype codes -> torch dtype attribute names (mirrors safetensors.torch).
DTYPE_NAMES: dict[str, str] = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2": "float8_e5m2",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "C64": "complex64",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
}
DTYPE_SIZES: dict[str, int] = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E4M3FNUZ": 1,
    "F8_E5M2": 1,
    "F8_E5M2FNUZ": 1,
    "C64": 8,
    "U64": 8,
    "U32": 4,
    "U16": 2,
}


class PackageFormatError(ValueError):
    """A damaged or malformed package. The message names the package and the problem."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors header, checked against the data section."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass
class SafetensorsData:
    tensors: dict[str, torch.Tensor]
    metadata: dict[str, str] = field(default_factory=dict)
    """The header's ``__metadata__`` (str -> str), empty when absent."""


# ---------------------------------------------------------------------------------------------
# zip layer
# ---------------------------------------------------------------------------------------------


def check_member_name(path: str, name: str) -> None:
    """Refuse a member name that is empty, absolute, has a drive letter or a ``..`` component."""
    bad = (
        not name
        or "\x00" in name
        or name.startswith(("/", "\\"))
        or (len(name) >= 2 and name[1] == ":")  # drive letter, C:foo
        or any(part == ".." for part in name.replace("\\", "/").split("/"))
    )
    if bad:
        raise PackageFormatError(
            path, f"zip member {name!r} escapes the package folder (absolute or '..' path)"
        )


def check_zip_directory(
    path: str,
    zf: zipfile.ZipFile,
    archive_size: int,
    *,
    kind: str = "package",
    max_members: int = MAX_MEMBERS,
) -> dict[str, zipfile.ZipInfo]:
    """Member name -> info, once every entry of the central directory is known to be sane.

    ``kind`` names the format in the message that refuses compressed members ("a .ptn stores ...").
    """
    infos = zf.infolist()
    if len(infos) > max_members:
        raise PackageFormatError(path, f"too many zip members ({len(infos)} > {max_members})")
    members: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        name = info.filename
        check_member_name(path, name)
        if name in members:
            raise PackageFormatError(path, f"duplicate zip member {name!r}")
        members[name] = info
        if info.flag_bits & 0x1:
            raise PackageFormatError(path, f"zip member {name!r} is encrypted")
        unsupported = [what for bit, what in UNSUPPORTED_FLAG_BITS.items() if info.flag_bits & bit]
        if unsupported:
            raise PackageFormatError(
                path, f"zip member {name!r} uses an unsupported zip feature: {', '.join(unsupported)}"
            )
        if info.compress_type != zipfile.ZIP_STORED:
            raise PackageFormatError(
                path,
                f"zip member {name!r} is compressed (method {info.compress_type}); a {kind} stores "
                "members uncompressed, so a compressed member (possible zip bomb) is refused",
            )
        if info.file_size != info.compress_size:
            raise PackageFormatError(
                path,
                f"zip member {name!r} declares {info.file_size} bytes but stores {info.compress_size}",
            )
        if info.header_offset < 0 or info.header_offset + 30 + info.compress_size > archive_size:
            raise PackageFormatError(
                path,
                f"zip member {name!r} declares {info.file_size} bytes at offset {info.header_offset}, "
                f"which extends past the end of the archive ({archive_size} bytes): truncated or corrupt",
            )
    return members


def open_zip(
    path: str | os.PathLike[str], *, kind: str = "package", max_members: int = MAX_MEMBERS
) -> tuple[zipfile.ZipFile, dict[str, zipfile.ZipInfo]]:
    """Open a package zip and check its directory; the caller closes the returned ``ZipFile``.

    ``FileNotFoundError``/``IsADirectoryError``/``PermissionError`` propagate unchanged (a missing file is
    not a damaged one).
    """
    spath = str(path)
    archive_size = os.stat(path).st_size
    try:
        zf = zipfile.ZipFile(path)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except NotImplementedError as exc:
        raise PackageFormatError(spath, f"uses an unsupported zip feature: {exc}") from exc
    except ZIP_ERRORS as exc:
        raise PackageFormatError(
            spath, f"not a readable zip archive (truncated or corrupt zip): {exc}"
        ) from exc
    try:
        members = check_zip_directory(spath, zf, archive_size, kind=kind, max_members=max_members)
    except BaseException:
        zf.close()
        raise
    return zf, members


def require_member(path: str, members: dict[str, zipfile.ZipInfo], name: str) -> zipfile.ZipInfo:
    if name not in members:
        raise PackageFormatError(path, f"missing member {name!r}")
    return members[name]


def _open_member(path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> IO[bytes]:
    try:
        return zf.open(info)
    except ZIP_ERRORS as exc:
        raise PackageFormatError(path, f"zip member {info.filename!r} is corrupt: {exc}") from exc


def _read_exact(path: str, stream: IO[bytes], n: int, what: str) -> bytes:
    """Read exactly ``n`` bytes (``n`` already checked against the member size)."""
    try:
        data: bytes = stream.read(n)
    except ZIP_ERRORS as exc:
        raise PackageFormatError(path, f"{what} is corrupt: {exc}") from exc
    if len(data) != n:
        raise PackageFormatError(path, f"{what} is truncated: expected {n} bytes, got {len(data)}")
    return data


def read_member(path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo, cap: int) -> bytes:
    """The bytes of one member, refused before reading when it declares more than ``cap``; CRC checked."""
    if info.file_size > cap:
        raise PackageFormatError(
            path, f"zip member {info.filename!r} declares {info.file_size} bytes, more than the cap {cap}"
        )
    with _open_member(path, zf, info) as stream:
        data = _read_exact(path, stream, info.file_size, f"zip member {info.filename!r}")
        _expect_end(path, stream, f"zip member {info.filename!r}")
    return data


# ---------------------------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------------------------


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The object, built in C; only an object that has a duplicate is walked in Python to name it."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r}")
            seen.add(key)
    return out


class _TooManyObjects(ValueError):
    """More JSON objects than the caller allows, raised as soon as one too many is parsed."""


def loads_json(raw: bytes, *, max_objects: int | None = None) -> Any:
    """Strict JSON: UTF-8, no duplicate keys, no NaN/Infinity. Every problem is a ``ValueError``
    (including ``UnicodeDecodeError``, ``json.JSONDecodeError`` and nesting too deep).

    ``max_objects`` stops the parse at the object past it, before the rest of the document is built:
    what the document costs in memory and time then depends on the cap, not on its length.
    """
    objects = 0

    def build_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal objects
        objects += 1
        if max_objects is not None and objects > max_objects:
            raise _TooManyObjects(f"more than {max_objects} JSON objects")
        return _no_duplicate_keys(pairs)

    def reject_constant(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")

    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=build_object, parse_constant=reject_constant)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc


# ---------------------------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------------------------


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_safetensors_header(path: str, header: object, data_len: int, where: str) -> list[TensorEntry]:
    """Check a decoded safetensors header against a data section of ``data_len`` bytes."""
    if not isinstance(header, dict):
        raise PackageFormatError(
            path, f"bad safetensors header in {where}: expected a JSON object, got {type(header).__name__}"
        )
    count = len(header) - (SAFETENSORS_METADATA_KEY in header)
    if count > MAX_TENSORS:
        raise PackageFormatError(path, f"too many tensors in {where}: {count} > {MAX_TENSORS}")
    entries: list[TensorEntry] = []
    for key, spec in header.items():
        if key == SAFETENSORS_METADATA_KEY:
            if not isinstance(spec, dict) or not all(isinstance(v, str) for v in spec.values()):
                raise PackageFormatError(
                    path, f"bad safetensors header in {where}: {key!r} must map strings to strings"
                )
            continue
        if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
            raise PackageFormatError(
                path,
                f"bad safetensors header in {where}: tensor {key!r} must be an object with exactly "
                "'dtype', 'shape' and 'data_offsets'",
            )
        dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
        if not isinstance(dtype, str):
            raise PackageFormatError(
                path, f"bad safetensors header in {where}: tensor {key!r} dtype is not a string"
            )
        if dtype not in DTYPE_SIZES:
            raise PackageFormatError(path, f"unknown dtype {dtype!r} for tensor {key!r} in {where}")
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_RANK
            or not all(_is_int(d) and d >= 0 for d in shape)
        ):
            raise PackageFormatError(
                path,
                f"bad safetensors header in {where}: tensor {key!r} shape {shape!r} is not a list of "
                f"at most {MAX_RANK} non-negative ints",
            )
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets):
            raise PackageFormatError(
                path,
                f"bad safetensors header in {where}: tensor {key!r} data_offsets {offsets!r} "
                "is not [begin, end]",
            )
        begin, end = offsets
        if not 0 <= begin <= end <= data_len:
            raise PackageFormatError(
                path,
                f"tensor {key!r} data offsets out of range: [{begin}, {end}] in a data section of "
                f"{data_len} bytes ({where})",
            )
        nbytes = math.prod(shape) * DTYPE_SIZES[dtype]
        if nbytes != end - begin:
            raise PackageFormatError(
                path,
                f"tensor {key!r} data offsets out of range: dtype {dtype} shape {shape} needs {nbytes} "
                f"bytes but [{begin}, {end}] spans {end - begin} ({where})",
            )
        if math.prod(d or 1 for d in shape) * DTYPE_SIZES[dtype] > MAX_TENSOR_SPAN:
            raise PackageFormatError(
                path,
                f"tensor {key!r} shape {shape} is too large: dtype {dtype} dimensions span more than "
                f"{MAX_TENSOR_SPAN} bytes (a zero dimension counted as one), which torch cannot describe "
                f"({where})",
            )
        entries.append(TensorEntry(key, dtype, tuple(shape), begin, end))
    # The tensors must tile the data section exactly (no overlap, no hole): as safetensors requires.
    cursor = 0
    for entry in sorted(entries, key=lambda e: (e.begin, e.end)):
        if entry.begin != cursor:
            problem = "overlaps another tensor" if entry.begin < cursor else "leaves a gap before it"
            raise PackageFormatError(
                path,
                f"tensor {entry.key!r} data offsets out of range: [{entry.begin}, {entry.end}] {problem}",
            )
        cursor = entry.end
    if cursor != data_len:
        raise PackageFormatError(
            path,
            f"data offsets out of range: tensors cover {cursor} bytes of a {data_len}-byte data "
            f"section in {where}",
        )
    return entries


READ_CHUNK = 1024 * 1024
"""Bytes moved from a member into a tensor per read: the only transient copy while reading tensors. As fast
as larger chunks, and small enough that malloc's heap does not keep a large freed chunk resident."""


def read_safetensors(
    path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo, *, max_header_bytes: int = MAX_HEADER_BYTES
) -> SafetensorsData:
    """The tensors (and header metadata) of a safetensors member whose directory entry was checked by
    :func:`check_zip_directory`: the header is validated before any tensor is allocated.

    Each tensor is then read from the member straight into its own storage, in data order, a chunk at a
    time: holding the whole member as one ``bytes`` and copying every tensor out of it cost 2x the package
    at the peak. The member's CRC is verified when its last byte is read, as :func:`read_member` does.
    """
    import torch

    from pytest_ptn.instruments.content import host_memory

    where = info.filename
    size = info.file_size  # already bounded by the archive size (stored, span checked)
    if size < 8:
        raise PackageFormatError(path, f"bad safetensors header: {where} is only {size} bytes")
    with _open_member(path, zf, info) as stream:
        (header_len,) = struct.unpack("<Q", _read_exact(path, stream, 8, where))
        if header_len > size - 8 or header_len > max_header_bytes:
            raise PackageFormatError(
                path,
                f"absurd safetensors header length {header_len} in {where}: exceeds the "
                f"member ({size} bytes) or the cap ({max_header_bytes} bytes); refused before reading it",
            )
        raw_header = _read_exact(path, stream, header_len, f"{where} header")
        try:
            # a valid header has one object per tensor, besides its own and __metadata__'s
            header = loads_json(raw_header, max_objects=MAX_TENSORS + 2)
        except _TooManyObjects as exc:
            raise PackageFormatError(
                path, f"too many tensors in {where}: more than {MAX_TENSORS} ({exc}, refused while parsing)"
            ) from exc
        except ValueError as exc:  # includes UnicodeDecodeError and json.JSONDecodeError
            raise PackageFormatError(
                path, f"bad safetensors header in {where}: not valid JSON ({exc})"
            ) from exc
        entries = parse_safetensors_header(path, header, size - 8 - header_len, where)
        dtypes = {}
        for entry in entries:
            dtype = getattr(torch, DTYPE_NAMES[entry.dtype], None)
            if dtype is None:
                raise PackageFormatError(
                    path, f"unknown dtype {entry.dtype!r} for tensor {entry.key!r}: torch lacks it"
                )
            dtypes[entry.key] = dtype

        # Every size is now known to fit in the member, which fits in the archive: materialize. The entries
        # tile the data section (checked above), so reading them in offset order reads it exactly once.
        what = f"zip member {where!r}"
        tensors: dict[str, torch.Tensor] = {}
        for entry in sorted(entries, key=lambda e: e.begin):
            tensor = torch.empty(entry.shape, dtype=dtypes[entry.key])
            if entry.end > entry.begin:
                target = host_memory(tensor)  # its storage, writable
                for at in range(0, len(target), READ_CHUNK):
                    n = min(READ_CHUNK, len(target) - at)
                    target[at : at + n] = _read_exact(path, stream, n, what)
            tensors[entry.key] = tensor
        _expect_end(path, stream, what)
    metadata: dict[str, str] = dict(header.get(SAFETENSORS_METADATA_KEY) or {})
    return SafetensorsData(tensors, metadata)


def _expect_end(path: str, stream: IO[bytes], what: str) -> None:
    """Read past the last byte: zipfile verifies the CRC on reaching the end of a member."""
    try:
        stream.read(1)
    except ZIP_ERRORS as exc:
        raise PackageFormatError(path, f"{what} is corrupt: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# aliases
# ---------------------------------------------------------------------------------------------


def parse_aliases(
    path: str, raw: bytes, owners: Collection[str], *, member: str = ALIASES_MEMBER
) -> dict[str, str]:
    """An alias map ``{alias: owner}`` whose every alias names one of ``owners`` directly."""
    try:
        obj = loads_json(raw)
    except ValueError as exc:
        raise PackageFormatError(path, f"{member} is not valid JSON ({exc})") from exc
    if not isinstance(obj, dict) or not all(isinstance(v, str) for v in obj.values()):
        raise PackageFormatError(path, f"{member} must be a JSON object of string to string")
    aliases: dict[str, str] = obj
    for alias, owner in aliases.items():
        if alias == SAFETENSORS_METADATA_KEY:
            raise PackageFormatError(path, f"alias {alias!r} in {member} is reserved by safetensors")
        if alias in owners:
            raise PackageFormatError(path, f"key {alias!r} is both an owner and an alias (of {owner!r})")
    for alias, owner in aliases.items():
        if owner in aliases:
            # Refused either way; the chain is walked once, to tell a cycle from a chain.
            seen = {alias: 0}  # key -> its position on the chain: a linear walk
            cursor = owner
            while cursor in aliases and cursor not in seen:
                seen[cursor] = len(seen)
                cursor = aliases[cursor]
            if cursor in seen:
                loop = " -> ".join([*list(seen)[seen[cursor] :], cursor])
                raise PackageFormatError(path, f"alias cycle in {member}: {loop}")
            raise PackageFormatError(
                path,
                f"alias {alias!r} names {owner!r}, which is itself an alias (alias of an alias); "
                f"an alias must name an owner",
            )
        if owner not in owners:
            raise PackageFormatError(
                path, f"alias {alias!r} points to missing owner {owner!r} (no safetensors entry)"
            )
    return aliases


__all__ = [
    "ALIASES_MEMBER",
    "DTYPE_NAMES",
    "DTYPE_SIZES",
    "MAX_ALIASES_BYTES",
    "MAX_HEADER_BYTES",
    "MAX_MEMBERS",
    "MAX_RANK",
    "MAX_TENSORS",
    "MAX_TENSOR_SPAN",
    "SAFETENSORS_METADATA_KEY",
    "UNSUPPORTED_FLAG_BITS",
    "ZIP_ERRORS",
    "PackageFormatError",
    "SafetensorsData",
    "TensorEntry",
    "check_member_name",
    "check_zip_directory",
    "loads_json",
    "open_zip",
    "parse_aliases",
    "parse_safetensors_header",
    "read_member",
    "read_safetensors",
    "require_member",
]
