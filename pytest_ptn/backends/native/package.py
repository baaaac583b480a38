"""Reading an ExecuTorch native ``.ptn`` package, refusing damaged ones (rule X2).

A ``.ptn`` (written by ``executorch.exir.native.to_native(ep).save(path)``, i.e. by
``executorch.exir._serialize._ptn.write_ptn``) is an *uncompressed* zip holding:

    program.ptg           the native Program flatbuffer (file identifier ``NPTG``)
    program.safetensors   the stored tensors (owners only); absent when there are none
    aliases.json          ``{alias: owner}``, only when content dedupe made aliases

:func:`read_ptn` checks every size it is about to trust *before* allocating for it, with the
format-independent checks of :mod:`pytest_ptn.reference.zipdata`: the zip central directory (member spans must
lie inside the archive, members must be stored uncompressed, so a member can never inflate past the
archive's size), the 8-byte safetensors header length (against the member size and a cap), each
tensor's dtype, shape and data offsets (against the data section), and the alias map. Only then are the
tensors materialized (each read straight from the member into its own storage) and the program
deserialized (with executorch's own deserializer). Every problem raises :class:`PtnFormatError` (a
:class:`~pytest_ptn.reference.zipdata.PackageFormatError`), whose message names the package path, what is
wrong and the member/key involved.

Importing this module needs neither torch nor executorch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_ptn.reference import zipdata
from pytest_ptn.reference.zipdata import (
    ALIASES_MEMBER,
    MAX_ALIASES_BYTES,
    MAX_HEADER_BYTES,
    MAX_MEMBERS,
    MAX_RANK,
    SAFETENSORS_METADATA_KEY,
    PackageFormatError,
)

if TYPE_CHECKING:
    import torch
    from executorch.backends.native.serialization.schema import Program

PTG_MEMBER = "program.ptg"
SAFETENSORS_MEMBER = "program.safetensors"
PTG_FILE_IDENTIFIER = b"NPTG"
#: A program.ptg holds graphs only (no weights).
MAX_PTG_BYTES = 256 * 1024 * 1024


class PtnFormatError(PackageFormatError):
    """A damaged or malformed ``.ptn`` package. The message names the package and the problem."""


@contextmanager
def _as_ptn_errors() -> Iterator[None]:
    """The format-independent checks raise PackageFormatError; a .ptn reader raises PtnFormatError."""
    try:
        yield
    except PtnFormatError:
        raise
    except PackageFormatError as exc:
        raise PtnFormatError(exc.path, exc.problem) from exc


@dataclass
class PtnPackage:
    """A validated ``.ptn`` package: the deserialized program and its tensors."""

    path: Path
    program: Program  # executorch.backends.native.serialization.schema.Program
    tensors: dict[str, torch.Tensor]  # owner name -> tensor
    aliases: dict[str, str] = field(default_factory=dict)  # alias -> owner

    def tensor(self, key: str) -> torch.Tensor:
        """The tensor stored under ``key`` (an owner, or an alias resolved to its owner)."""
        owner = self.aliases.get(key, key)
        try:
            return self.tensors[owner]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor stored under {key!r}") from None

    def keys(self) -> list[str]:
        """Every data key the package can resolve: owners and aliases, sorted."""
        return sorted({*self.tensors, *self.aliases})

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and (key in self.tensors or key in self.aliases)

    @property
    def method_names(self) -> list[str]:
        return [m.name for m in self.program.methods]


# ---------------------------------------------------------------------------------------------
# tensor metadata: what the reader checks stored tensors against, and the interpreter inputs
# ---------------------------------------------------------------------------------------------

# ScalarType ids (ExecuTorch numbering) -> torch dtype names.
_SCALAR_TYPES: dict[int, str] = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    5: "float16",
    6: "float32",
    7: "float64",
    11: "bool",
    15: "bfloat16",
    16: "uint16",
    17: "uint32",
    18: "uint64",
}


def scalar_type_to_dtype(scalar_type: object) -> torch.dtype:
    """The torch dtype of an ExecuTorch ``ScalarType`` id."""
    import torch

    try:
        name = _SCALAR_TYPES[int(scalar_type)]  # type: ignore[call-overload]
        dtype = getattr(torch, name)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise NotImplementedError(f"unsupported ScalarType {scalar_type!r}") from None
    assert isinstance(dtype, torch.dtype)
    return dtype


def shape_fits(sizes: Sequence[Any], shape: Sequence[int]) -> bool:
    """Whether a TensorMeta's ``sizes`` admit ``shape``: the same rank, each dimension within its
    ``[min, max]`` (a negative ``max`` is unbounded, a dynamic dimension)."""
    return len(sizes) == len(shape) and all(
        d.min <= n and (d.max < 0 or n <= d.max) for d, n in zip(sizes, shape, strict=True)
    )


# ---------------------------------------------------------------------------------------------
# program
# ---------------------------------------------------------------------------------------------


def _deserialize(path: str, ptg: bytes) -> Any:
    if len(ptg) < 8 or ptg[4:8] != PTG_FILE_IDENTIFIER:
        raise PtnFormatError(
            path,
            f"cannot deserialize {PTG_MEMBER}: not a native program flatbuffer (no "
            f"{PTG_FILE_IDENTIFIER.decode()} file identifier)",
        )
    from executorch.backends.native.serialization.graph_serialize import deserialize_program

    try:
        return deserialize_program(ptg)
    except Exception as exc:  # flatc failure (CalledProcessError), bad JSON, dataclass mismatch...
        raise PtnFormatError(path, f"cannot deserialize {PTG_MEMBER}: {type(exc).__name__}: {exc}") from exc


def _iter_metas(program: Any) -> Iterator[tuple[str, str, Any]]:
    """(method, data key, meta) for every constant binding."""
    for method in program.methods:
        for const in method.constants or []:
            yield method.name, const.data_key, const.meta


def _check_program(path: str, program: Any, package: PtnPackage) -> None:
    from executorch.backends.native.serialization.graph_serialize import collect_data_keys, validate_program

    try:
        names = [m.name for m in program.methods]
        validate_program(program)
        referenced = collect_data_keys(program)
    except Exception as exc:
        raise PtnFormatError(path, f"invalid program in {PTG_MEMBER}: {type(exc).__name__}: {exc}") from exc
    if len(set(names)) != len(names):
        raise PtnFormatError(path, f"duplicate method names in {PTG_MEMBER}: {names}")
    for key in sorted(referenced):
        if key not in package:
            users = sorted({m for m, k, _ in _iter_metas(program) if k == key}) or ["(quantization metadata)"]
            raise PtnFormatError(
                path, f"data key {key!r} referenced by method {users[0]!r} has no tensor data in the package"
            )
    for method_name, key, meta in _iter_metas(program):
        if meta is None or meta.quant is not None:
            continue  # packed storage: byte length follows the quant scheme, not the sizes
        tensor = package.tensor(key)
        try:
            dtype = scalar_type_to_dtype(meta.dtype)
        except NotImplementedError as exc:
            raise PtnFormatError(path, f"method {method_name!r} key {key!r}: {exc}") from exc
        if tensor.dtype != dtype or not shape_fits(meta.sizes, tensor.shape):
            declared = [d.min if d.min == d.max else (d.min, d.max) for d in meta.sizes]
            raise PtnFormatError(
                path,
                f"data key {key!r} holds {tensor.dtype} {list(tensor.shape)} but method {method_name!r} "
                f"declares {dtype} {declared}: does not match",
            )


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------


def read_ptn(
    path: str | os.PathLike[str],
    *,
    max_header_bytes: int = MAX_HEADER_BYTES,
    max_ptg_bytes: int = MAX_PTG_BYTES,
) -> PtnPackage:
    """Read and validate a ``.ptn`` package; raise :class:`PtnFormatError` if it is damaged.

    ``FileNotFoundError``/``IsADirectoryError`` propagate unchanged (a missing file is not a damaged one).
    """
    p = Path(path)
    spath = str(p)
    with _as_ptn_errors():
        zf, members = zipdata.open_zip(p, kind=".ptn")
        with zf:
            zipdata.require_member(spath, members, PTG_MEMBER)
            tensors: dict[str, torch.Tensor] = {}
            if SAFETENSORS_MEMBER in members:
                info = members[SAFETENSORS_MEMBER]
                tensors = zipdata.read_safetensors(spath, zf, info, max_header_bytes=max_header_bytes).tensors
            aliases: dict[str, str] = {}
            if ALIASES_MEMBER in members:
                raw = zipdata.read_member(spath, zf, members[ALIASES_MEMBER], MAX_ALIASES_BYTES)
                aliases = zipdata.parse_aliases(spath, raw, tensors, member=ALIASES_MEMBER)
            ptg = zipdata.read_member(spath, zf, members[PTG_MEMBER], max_ptg_bytes)
    program = _deserialize(spath, ptg)
    package = PtnPackage(path=p, program=program, tensors=tensors, aliases=aliases)
    _check_program(spath, program, package)
    return package


__all__ = [
    "ALIASES_MEMBER",
    "MAX_ALIASES_BYTES",
    "MAX_HEADER_BYTES",
    "MAX_MEMBERS",
    "MAX_PTG_BYTES",
    "MAX_RANK",
    "PTG_MEMBER",
    "SAFETENSORS_MEMBER",
    "SAFETENSORS_METADATA_KEY",
    "PackageFormatError",
    "PtnFormatError",
    "PtnPackage",
    "read_ptn",
    "scalar_type_to_dtype",
    "shape_fits",
]
