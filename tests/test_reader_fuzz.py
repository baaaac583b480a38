"""Both package readers, fed mutated valid packages, refuse with their documented error or read right (X2).

Each example takes a valid package (the reference package built here, the committed golden ``.ptn``),
edits its members (safetensors header fields incl. huge and zero dimensions, many empty entries, header
length, alias chains and cycles, JSON members, member bytes, dropped and duplicated members) and then its
zip bytes (central directory and local header fields, byte flips, truncation), and reads it. The reader
must raise its documented error (:class:`~pytest_ptn.reference.zipdata.PackageFormatError`, for a ``.ptn``
:class:`~pytest_ptn.backends.native.package.PtnFormatError`) or give back exactly the tensors and aliases the
package holds; within the deadline, so unbounded work fails too.

By default each reader gets :data:`DEFAULT_EXAMPLES` derandomized examples (seconds, for CI). A large
random run: ``PTN_READER_FUZZ_EXAMPLES=20000 pytest tests/test_reader_fuzz.py -p no:cacheprovider
--hypothesis-show-statistics`` (docs/fuzzing.md).
"""

from __future__ import annotations

import io
import json
import os
import struct
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from pytest_ptn.backends.native.package import SAFETENSORS_MEMBER
from pytest_ptn.reference import zipdata
from pytest_ptn.reference.package import ALIASES, BINDINGS, DATA, Package, read_package, write_zip
from pytest_ptn.reference.zipdata import PackageFormatError

GOLDEN = Path(__file__).resolve().parent.parent / "fixtures" / "golden" / "linear_buffer.ptn"
DEFAULT_EXAMPLES = 100
EXAMPLES_VARIABLE = "PTN_READER_FUZZ_EXAMPLES"
DEADLINE = timedelta(seconds=10)
"""A mutated package of a few kilobytes reads or is refused in milliseconds: more is unbounded work."""
FIXED_TIME = (1980, 1, 1, 0, 0, 0)

Members = list[tuple[str, bytes]]

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # executorch's importlib.resources use

_examples = os.environ.get(EXAMPLES_VARIABLE)
FUZZ = settings(
    max_examples=int(_examples) if _examples else DEFAULT_EXAMPLES,
    derandomize=not _examples,  # CI: the same examples every run; a large run explores new ones
    database=None,
    deadline=DEADLINE,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def reference_package() -> bytes:
    """A valid reference package: several dtypes, an empty and a 0-dim tensor, aliases, state, bindings."""
    g = torch.Generator().manual_seed(0)
    tensors = {
        "m/w": torch.rand(3, 4, generator=g),
        "m/h": torch.rand(5, generator=g).half(),
        "m/i": torch.arange(-2, 4, dtype=torch.int64),
        "m/f": torch.tensor([True, False]),
        "m/s": torch.tensor(1.5),
        "m/e": torch.empty(0, 3),
        "state/kv": torch.zeros(4, dtype=torch.int32),
    }
    bindings = {
        "m": {
            "inputs": [{"kind": "constant", "key": "w", "final": "m/w"}, {"kind": "user", "index": 0}],
            "outputs": [{"kind": "state", "final": "state/kv"}, {"kind": "user"}],
        },
        "n": {"inputs": [{"kind": "constant", "key": "w", "final": "n/w"}], "outputs": []},
    }
    buf = io.BytesIO()
    write_zip(buf, Package(tensors, {"n/w": "m/w", "n/h": "m/h"}, bindings, ["state/kv"]))
    return buf.getvalue()


REFERENCE = reference_package()


def members_of(blob: bytes) -> Members:
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        return [(info.filename, z.read(info)) for info in z.infolist()]


def zip_of(members: Members) -> bytes:
    """Members stored, timestamps fixed: as both writers lay a package out."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a duplicated member warns
        for name, data in members:
            z.writestr(zipfile.ZipInfo(name, FIXED_TIME), data)
    return buf.getvalue()


def split_safetensors(st_bytes: bytes) -> tuple[dict[str, Any], bytes]:
    (n,) = struct.unpack("<Q", st_bytes[:8])
    return json.loads(st_bytes[8 : 8 + n]), st_bytes[8 + n :]


def join_safetensors(header: dict[str, Any], data: bytes) -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _safetensors_member(members: Members) -> str | None:
    return next((name for name, _ in members if name.endswith(".safetensors")), None)


def _header_of(members: Members) -> tuple[str, dict[str, Any], bytes] | None:
    """The safetensors member's name, header and data; None when an earlier edit left none to edit."""
    name = _safetensors_member(members)
    if name is None:
        return None
    try:
        header, data = split_safetensors(dict(members)[name])
    except (ValueError, struct.error):
        return None
    return (name, header, data) if isinstance(header, dict) else None


def _replace(members: Members, name: str, data: bytes) -> Members:
    return [(n, data if n == name else d) for n, d in members]


# ---- member edits: the zip stays well formed, its content is damaged ------------------------------


@dataclass(frozen=True)
class HeaderField:
    """Set (or drop) one field of one tensor entry of the safetensors header."""

    entry: int
    field: str
    value: Any

    def apply(self, members: Members) -> Members:
        found = _header_of(members)
        keys = [k for k in found[1] if k != zipdata.SAFETENSORS_METADATA_KEY] if found else []
        if not found or not keys:
            return members
        name, header, data = found
        key = keys[self.entry % len(keys)]
        if self.field == "delete":
            del header[key]
        elif self.field == "rename":
            header[str(self.value)] = header.pop(key)
        else:
            header[key] = {**header[key], self.field: self.value}
        return _replace(members, name, join_safetensors(header, data))


@dataclass(frozen=True)
class EmptyEntries:
    """Zero-byte entries appended to the header: free in the data section, whatever their shape."""

    count: int
    dtype: str
    shape: tuple[int, ...]

    def apply(self, members: Members) -> Members:
        found = _header_of(members)
        if not found:
            return members
        name, header, data = found
        for i in range(self.count):
            header[f"fuzz/empty{i}"] = {
                "dtype": self.dtype,
                "shape": list(self.shape),
                "data_offsets": [0, 0],
            }
        return _replace(members, name, join_safetensors(header, data))


@dataclass(frozen=True)
class HeaderLength:
    value: int

    def apply(self, members: Members) -> Members:
        name = _safetensors_member(members)
        if name is None:
            return members
        return _replace(members, name, struct.pack("<Q", self.value) + dict(members)[name][8:])


@dataclass(frozen=True)
class Aliases:
    """Replace the alias map: a chain or a cycle of ``length`` links, or an alias to a missing key."""

    shape: str
    length: int

    def apply(self, members: Members) -> Members:
        found = _header_of(members)
        owners = sorted(k for k in found[1] if k != zipdata.SAFETENSORS_METADATA_KEY) if found else []
        owner = owners[self.length % len(owners)] if owners else "fuzz/no-owner"
        links = [f"fuzz/a{i}" for i in range(self.length)]
        aliases: dict[str, str] = dict(zip(links, [*links[1:], owner], strict=True))
        if self.shape == "cycle":
            aliases[links[-1]] = links[0]
        elif self.shape == "missing":
            aliases[links[-1]] = "fuzz/missing"
        elif self.shape == "owner":
            aliases[owner] = links[0]
        encoded = json.dumps(aliases).encode()
        if any(n == ALIASES for n, _ in members):
            return _replace(members, ALIASES, encoded)
        return [*members, (ALIASES, encoded)]


@dataclass(frozen=True)
class JsonMember:
    """Replace a JSON member (aliases, bindings) with other JSON."""

    member: str
    value: Any

    def apply(self, members: Members) -> Members:
        return _replace(members, self.member, json.dumps(self.value).encode())


@dataclass(frozen=True)
class MemberBytes:
    """Overwrite bytes inside one member (its CRC is recomputed: the zip is valid, the content is not)."""

    member: int
    writes: tuple[tuple[int, int], ...]
    truncate_at: int | None

    def apply(self, members: Members) -> Members:
        name, data = members[self.member % len(members)]
        out = bytearray(data)
        for at, value in self.writes:
            if out:
                out[at % len(out)] = value
        if self.truncate_at is not None:
            out = out[: self.truncate_at]
        return _replace(members, name, bytes(out))


@dataclass(frozen=True)
class MemberListEdit:
    """Drop, duplicate or add a member."""

    action: str
    member: int
    name: str

    def apply(self, members: Members) -> Members:
        name, data = members[self.member % len(members)]
        if self.action == "drop":
            return [m for m in members if m[0] != name]
        if self.action == "duplicate":
            return [*members, (name, data)]
        return [*members, (self.name, data)]


# ---- zip edits: the bytes of the archive itself ---------------------------------------------------

# record signature -> (field offset, width) of the fields worth damaging
RECORD_FIELDS: dict[bytes, list[tuple[int, int]]] = {
    b"PK\x01\x02": [(4, 2), (6, 2), (8, 2), (10, 2), (16, 4), (20, 4), (24, 4), (28, 2), (30, 2), (42, 4)],
    b"PK\x03\x04": [(4, 2), (6, 2), (8, 2), (14, 4), (18, 4), (22, 4), (26, 2), (28, 2)],
    b"PK\x05\x06": [(4, 2), (8, 2), (10, 2), (12, 4), (16, 4), (20, 2)],
}


@dataclass(frozen=True)
class RecordField:
    """Set one field of one zip record (central directory entry, local header, end of directory)."""

    signature: bytes
    record: int
    field: int
    value: int

    def apply(self, blob: bytes) -> bytes:
        starts = []
        at = blob.find(self.signature)
        while at >= 0:
            starts.append(at)
            at = blob.find(self.signature, at + 4)
        if not starts:
            return blob
        offset, width = RECORD_FIELDS[self.signature][self.field % len(RECORD_FIELDS[self.signature])]
        start = starts[self.record % len(starts)] + offset
        value = self.value % (1 << (8 * width))
        return blob[:start] + value.to_bytes(width, "little") + blob[start + width :]


@dataclass(frozen=True)
class ZipBytes:
    writes: tuple[tuple[int, int], ...]
    truncate_at: int | None

    def apply(self, blob: bytes) -> bytes:
        out = bytearray(blob)
        for at, value in self.writes:
            if out:
                out[at % len(out)] = value
        return bytes(out[: self.truncate_at] if self.truncate_at is not None else out)


# ---- strategies ------------------------------------------------------------------------------------

DIMENSIONS = st.one_of(
    st.integers(0, 8),
    st.sampled_from([2**31 - 1, 2**31, 2**32, 2**40, 2**61, 2**62, 2**63 - 1, 2**63, 2**64, -1]),
    st.integers(-(2**65), 2**65),
)
SHAPES = st.lists(DIMENSIONS, max_size=6).map(tuple)
DTYPES = st.one_of(st.sampled_from(sorted(zipdata.DTYPE_SIZES)), st.just("F128"), st.integers(0, 3))
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
FIELD_VALUES = st.one_of(
    st.sampled_from([0, 1, 0x20, 0x40, 0x41, 8, 99, 0xFF, 0xFFFF, 0xFFFFFFFF, 2**31]),
    st.integers(0, 2**32 - 1),
)
BYTE_WRITES = st.lists(st.tuples(st.integers(0, 2**20), st.integers(0, 255)), max_size=6).map(tuple)

MEMBER_EDITS = st.one_of(
    st.builds(
        HeaderField,
        st.integers(0, 16),
        st.sampled_from(["shape", "dtype", "data_offsets", "delete", "rename", "extra"]),
        st.one_of(SHAPES.map(list), DTYPES, st.lists(st.integers(-2, 2**64), max_size=3), JSON),
    ),
    st.builds(HeaderField, st.integers(0, 16), st.just("shape"), SHAPES.map(list)),
    st.builds(EmptyEntries, st.integers(1, 2000), st.sampled_from(sorted(zipdata.DTYPE_SIZES)), SHAPES),
    st.builds(HeaderLength, st.one_of(st.integers(0, 4096), st.integers(0, 2**64 - 1))),
    st.builds(Aliases, st.sampled_from(["chain", "cycle", "missing", "owner"]), st.integers(1, 5000)),
    st.builds(JsonMember, st.sampled_from([ALIASES, BINDINGS]), JSON),
    st.builds(MemberBytes, st.integers(0, 8), BYTE_WRITES, st.none() | st.integers(0, 4096)),
    st.builds(
        MemberListEdit,
        st.sampled_from(["drop", "duplicate", "add"]),
        st.integers(0, 8),
        st.sampled_from(["extra.bin", "../evil", "/abs", "C:evil", "a\\..\\b", ""]),
    ),
)
ZIP_EDITS = st.one_of(
    st.builds(
        RecordField,
        st.sampled_from(sorted(RECORD_FIELDS)),
        st.integers(0, 8),
        st.integers(0, 16),
        FIELD_VALUES,
    ),
    st.builds(ZipBytes, BYTE_WRITES, st.none() | st.integers(0, 2**16)),
)


@dataclass(frozen=True)
class Mutation:
    member_edits: list[Any]
    zip_edits: list[Any]

    def apply(self, blob: bytes) -> bytes:
        members = members_of(blob)
        for member_edit in self.member_edits:
            members = member_edit.apply(members)
        out = zip_of(members)
        for zip_edit in self.zip_edits:
            out = zip_edit.apply(out)
        return out


MUTATIONS = st.builds(Mutation, st.lists(MEMBER_EDITS, max_size=3), st.lists(ZIP_EDITS, max_size=2))
"""Either list may be empty: then the package is only re-zipped, and must read."""

CENTRAL = b"PK\x01\x02"
KNOWN_FINDINGS = [
    # an empty tensor whose other dimensions torch cannot describe (escaped as TypeError/RuntimeError)
    Mutation([EmptyEntries(1, "F32", (2**63, 0))], []),
    Mutation([EmptyEntries(1, "F32", (2**62, 2**62, 0))], []),
    Mutation([EmptyEntries(1, "F32", (0, 2**40, 2**40, 2**40))], []),
    # zip features zipfile does not implement (escaped as NotImplementedError): version needed to extract
    # 0xffff, flag bits 5 (patched data) and 6 (strong encryption)
    Mutation([], [RecordField(CENTRAL, 0, 1, 0xFFFF)]),
    Mutation([], [RecordField(CENTRAL, 0, 2, 1 << 5)]),
    Mutation([], [RecordField(CENTRAL, 0, 2, 1 << 6)]),
    # alias chains and cycles (walked in quadratic time)
    Mutation([Aliases("chain", 5000)], []),
    Mutation([Aliases("cycle", 5000)], []),
]
"""What the first adversarial run found (issue 13): run on every budget."""


def with_known_findings(test: Callable[..., None]) -> Callable[..., None]:
    for mutation in KNOWN_FINDINGS:
        test = example(mutation=mutation)(test)
    return test


# ---- the oracle -------------------------------------------------------------------------------------


def check_read_back(
    blob: bytes, safetensors: str, tensors: dict[str, torch.Tensor], aliases: dict[str, str]
) -> None:
    """A package that read must have given back what it holds: every entry of its ``safetensors`` member's
    header as a tensor of its dtype and shape with its bytes, and the alias map with each alias resolving to
    its owner. Only the members the readers use are read: others (garbled names included) are ignored."""
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        names = set(z.namelist())
        stored = {name: z.read(name) for name in (safetensors, ALIASES) if name in names}
    header, data = split_safetensors(stored[safetensors]) if safetensors in stored else ({}, b"")
    entries = {k: v for k, v in header.items() if k != zipdata.SAFETENSORS_METADATA_KEY}
    assert tensors.keys() == entries.keys()
    for key, entry in entries.items():
        tensor = tensors[key]
        begin, end = entry["data_offsets"]
        assert tensor.dtype == getattr(torch, zipdata.DTYPE_NAMES[entry["dtype"]]), key
        assert list(tensor.shape) == entry["shape"], key
        assert tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() == data[begin:end], key
    assert aliases == json.loads(stored.get(ALIASES, b"{}"))
    for alias, owner in aliases.items():
        assert owner in tensors and alias not in tensors, alias


def read_or_refuse(
    tmp: Path, blob: bytes, read: Callable[[Path], Any], error: type[PackageFormatError]
) -> Any | None:
    """The package read from ``blob``, or None when it was refused with ``error`` naming the file. Any other
    exception propagates: it is the finding."""
    path = tmp / "fuzzed.pkg"
    path.write_bytes(blob)
    try:
        package = read(path)
    except PackageFormatError as exc:
        assert isinstance(exc, error), f"{type(exc).__name__} is not the documented {error.__name__}: {exc}"
        assert str(exc).startswith(f"{path}: "), exc
        return None
    return package


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reader_fuzz")


def test_the_unmutated_packages_read(fuzz_dir: Path, ptn_reader: Callable[[Path], Any]) -> None:
    """The packages every example starts from read, and the oracle holds for them."""
    from pytest_ptn.backends.native.package import PtnFormatError

    for blob, read, error, safetensors in (
        (REFERENCE, read_package, PackageFormatError, DATA),
        (GOLDEN.read_bytes(), ptn_reader, PtnFormatError, SAFETENSORS_MEMBER),
    ):
        package = read_or_refuse(fuzz_dir, blob, read, error)
        assert package is not None
        check_read_back(blob, safetensors, package.tensors, package.aliases)


@FUZZ
@given(mutation=MUTATIONS)
@with_known_findings
def test_the_reference_reader_refuses_or_reads_correctly(fuzz_dir: Path, mutation: Mutation) -> None:
    blob = mutation.apply(REFERENCE)
    package = read_or_refuse(fuzz_dir, blob, read_package, PackageFormatError)
    event("refused" if package is None else "read")
    if package is not None:
        check_read_back(blob, DATA, package.tensors, package.aliases)


@pytest.fixture(scope="module")
def ptn_reader() -> Callable[[Path], Any]:
    """``read_ptn``, once executorch is imported (seconds, outside any example's deadline)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pytest.importorskip("executorch")
        from pytest_ptn.backends.native.package import read_ptn

        read_ptn(GOLDEN)
    return read_ptn


@FUZZ
@given(mutation=MUTATIONS)
@with_known_findings
def test_the_ptn_reader_refuses_or_reads_correctly(
    fuzz_dir: Path, ptn_reader: Callable[[Path], Any], mutation: Mutation
) -> None:
    from pytest_ptn.backends.native.package import PtnFormatError

    blob = mutation.apply(GOLDEN.read_bytes())
    package = read_or_refuse(fuzz_dir, blob, ptn_reader, PtnFormatError)
    event("refused" if package is None else "read")
    if package is not None:
        check_read_back(blob, SAFETENSORS_MEMBER, package.tensors, package.aliases)
