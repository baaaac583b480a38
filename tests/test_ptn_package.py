"""The .ptn reader: the golden package reads, every damaged package is refused clearly (rule X2)."""

from __future__ import annotations

import importlib.util
import json
import random
import struct
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # executorch's import uses deprecated importlib.resources APIs
    pytest.importorskip("executorch")
    pytest.importorskip("safetensors")
    import torch

from pytest_ptn.backends.native.package import (  # noqa: E402
    MAX_HEADER_BYTES,
    PtnFormatError,
    PtnPackage,
    read_ptn,
    shape_fits,
)
from pytest_ptn.reference import zipdata  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
GOLDEN = FIXTURES / "golden" / "linear_buffer.ptn"
DAMAGED = FIXTURES / "damaged"

# case -> phrase the PtnFormatError message must contain. Kept here on purpose (not read from
# fixtures/damaged/cases.json) so the two are checked against each other.
EXPECTED = {
    "truncated_zip": "truncated or corrupt zip",
    "crc_mismatch": "is corrupt",
    "huge_declared_size": "extends past the end of the archive",
    "zip_bomb": "possible zip bomb",
    "member_escapes_dotdot": "escapes the package folder",
    "member_escapes_absolute": "escapes the package folder",
    "duplicate_member": "duplicate zip member",
    "missing_ptg": "missing member 'program.ptg'",
    "bad_ptg": "cannot deserialize program.ptg",
    "bad_safetensors_header": "bad safetensors header",
    "bad_safetensors_structure": "bad safetensors header",
    "absurd_header_length": "absurd safetensors header length",
    "unknown_dtype": "unknown dtype",
    "data_offsets_out_of_range": "data offsets out of range",
    "aliases_not_object": "must be a JSON object of string to string",
    "alias_missing_owner": "missing owner",
    "alias_cycle": "alias cycle",
    "alias_of_alias": "alias of an alias",
    "owner_and_alias": "both an owner and an alias",
    "missing_data_key": "has no tensor data",
    "shape_mismatch": "does not match",
}
# The cases SPEC X2 names explicitly.
X2_CASES = {
    "truncated_zip",
    "bad_safetensors_header",
    "alias_missing_owner",
    "alias_cycle",
    "owner_and_alias",
    "member_escapes_dotdot",
    "absurd_header_length",
}


def _load_maker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_damaged", FIXTURES / "make_damaged.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


maker = _load_maker()


def _golden_members() -> list[tuple[str, bytes, int]]:
    with zipfile.ZipFile(GOLDEN) as zf:
        return [(i.filename, zf.read(i), zipfile.ZIP_STORED) for i in zf.infolist()]


def _write(tmp_path: Path, name: str, members: list[tuple[str, bytes, int]]) -> Path:
    path = tmp_path / name
    path.write_bytes(maker.zip_bytes(members))
    return path


# ---- golden ------------------------------------------------------------------------------------


def test_golden_reads() -> None:
    pkg = read_ptn(GOLDEN)
    assert isinstance(pkg, PtnPackage)
    assert pkg.path == GOLDEN
    assert pkg.method_names == ["forward"]
    assert pkg.aliases == {"two": "_lifted_tensor_constant2"}
    assert set(pkg.tensors) == {"_lifted_tensor_constant2", "count", "lin.bias", "lin.weight"}
    assert pkg.keys() == sorted([*pkg.tensors, "two"])
    assert pkg.tensor("two") is pkg.tensor("_lifted_tensor_constant2")
    assert pkg.tensor("two").item() == 2.0
    assert "two" in pkg and "nope" not in pkg
    torch.testing.assert_close(
        pkg.tensor("lin.weight"), torch.arange(12, dtype=torch.float32).reshape(3, 4) / 8
    )
    with pytest.raises(KeyError, match="nope"):
        pkg.tensor("nope")
    data_keys = {c.data_key for c in pkg.program.methods[0].constants}
    assert data_keys == set(pkg.keys())


def test_golden_without_aliases_and_without_tensors(tmp_path: Path) -> None:
    members = _golden_members()
    # no aliases.json: the alias key disappears, so the program's reference to it must be reported
    path = _write(tmp_path, "no_aliases.ptn", maker.without(members, "aliases.json"))
    with pytest.raises(PtnFormatError, match="'two' referenced by method 'forward' has no tensor data"):
        read_ptn(path)


def test_missing_file_is_not_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_ptn(tmp_path / "absent.ptn")


# ---- committed damaged fixtures ----------------------------------------------------------------


def test_cases_index_matches() -> None:
    index = json.loads((DAMAGED / "cases.json").read_text())
    assert {case: v["phrase"] for case, v in index.items()} == EXPECTED
    assert {p.stem for p in DAMAGED.glob("*.ptn")} == set(EXPECTED)
    assert set(EXPECTED) >= X2_CASES


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_damaged_package_is_refused(case: str) -> None:
    path = DAMAGED / f"{case}.ptn"
    assert path.stat().st_size < 16 * 1024  # fixtures stay small
    with pytest.raises(PtnFormatError) as info:
        read_ptn(path)
    message = str(info.value)
    assert EXPECTED[case] in message
    assert message.startswith(str(path))
    assert info.value.path == str(path)
    assert isinstance(info.value, ValueError)


def test_fixtures_are_current_and_deterministic() -> None:
    """Re-deriving every damaged case from the committed golden gives the committed bytes."""
    members = _golden_members()
    assert maker.zip_bytes(members) == GOLDEN.read_bytes()
    for case, (_, _, blob) in maker.make_cases(members).items():
        assert (DAMAGED / f"{case}.ptn").read_bytes() == blob, case


# ---- bounded memory by construction -----------------------------------------------------------


def test_absurd_header_length_is_refused_before_allocating(tmp_path: Path) -> None:
    members = _golden_members()
    blob = struct.pack("<Q", 2**64 - 1) + b"{}      "
    path = _write(tmp_path, "absurd.ptn", maker.replace(members, "program.safetensors", blob))
    with pytest.raises(PtnFormatError, match="refused before reading it") as info:
        read_ptn(path)
    assert str(2**64 - 1) in str(info.value)
    assert f"cap ({MAX_HEADER_BYTES} bytes)" in str(info.value)


def test_header_cap_is_configurable() -> None:
    with pytest.raises(PtnFormatError, match="absurd safetensors header length"):
        read_ptn(GOLDEN, max_header_bytes=16)


def test_ptg_cap_is_checked_on_declared_size() -> None:
    with pytest.raises(PtnFormatError, match="more than the cap 64"):
        read_ptn(GOLDEN, max_ptg_bytes=64)


def test_huge_shape_is_refused_without_allocating(tmp_path: Path) -> None:
    members = _golden_members()

    def huge(h: dict[str, dict[str, object]]) -> None:
        h["lin.weight"]["shape"] = [2**40, 2**40]

    st = maker.edit_header(maker.get(members, "program.safetensors"), huge)
    path = _write(tmp_path, "huge.ptn", maker.replace(members, "program.safetensors", st))
    with pytest.raises(PtnFormatError, match=r"'lin.weight' data offsets out of range: dtype F32 shape"):
        read_ptn(path)


@pytest.mark.parametrize("shape", [[2**63, 0], [2**62, 2**62, 0], [0, 2**40, 2**40, 2**40]])
def test_empty_tensor_with_huge_dimensions_is_refused(tmp_path: Path, shape: list[int]) -> None:
    """Zero bytes pass the size check whatever the other dimensions are: torch's int64 strides cannot."""

    header, data = maker.split_st(maker.get(_golden_members(), "program.safetensors"))
    header["ptn/empty"] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data)]}
    st = maker.join_st(header, data)
    path = _write(tmp_path, "huge.ptn", maker.replace(_golden_members(), "program.safetensors", st))
    with pytest.raises(PtnFormatError, match=r"tensor 'ptn/empty' shape .* is too large"):
        read_ptn(path)


@pytest.mark.parametrize("flag", [1 << 5, 1 << 6])
def test_unsupported_zip_flags_are_refused(tmp_path: Path, flag: int) -> None:
    """zipfile raises NotImplementedError for patched data and strong encryption."""
    blob = bytearray(GOLDEN.read_bytes())
    at = blob.find(b"PK\x01\x02")  # the first central directory entry: its flags at +8
    blob[at + 8 : at + 10] = struct.pack("<H", flag)
    path = tmp_path / "flags.ptn"
    path.write_bytes(bytes(blob))
    with pytest.raises(PtnFormatError, match="uses an unsupported zip feature"):
        read_ptn(path)


def test_unsupported_zip_version_is_refused(tmp_path: Path) -> None:
    blob = bytearray(GOLDEN.read_bytes())
    at = blob.find(b"PK\x01\x02")  # version needed to extract at +6
    blob[at + 6 : at + 8] = b"\xff\xff"
    path = tmp_path / "version.ptn"
    path.write_bytes(bytes(blob))
    with pytest.raises(PtnFormatError, match="uses an unsupported zip feature: zip file version"):
        read_ptn(path)


def test_long_alias_chain_is_refused_in_linear_time(tmp_path: Path) -> None:
    links = 100_000
    chain = {"two": "a0"} | {f"a{i}": f"a{i + 1}" for i in range(links)} | {f"a{links}": "count"}
    aliases = json.dumps(chain).encode()
    path = _write(tmp_path, "chain.ptn", maker.replace(_golden_members(), "aliases.json", aliases))
    start = time.monotonic()
    with pytest.raises(PtnFormatError, match="alias of an alias"):
        read_ptn(path)
    assert time.monotonic() - start < 10


def test_too_many_tensors_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zipdata, "MAX_TENSORS", 3)  # the golden stores 4
    with pytest.raises(PtnFormatError, match=r"too many tensors in program.safetensors: 4 > 3"):
        read_ptn(GOLDEN)


def test_reading_never_imports_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter and its graph runner import the reader: the reader importing either back would be
    a cycle. The reader is imported afresh and reads the golden package while importing them raises."""
    import pytest_ptn.backends.native as native

    for name in ("interpreter", "graph"):
        monkeypatch.setitem(sys.modules, f"{native.__name__}.{name}", None)  # an import of it raises
        monkeypatch.delattr(native, name, raising=False)
    monkeypatch.setattr(native, "package", native.package)  # undone: the module the other tests imported
    monkeypatch.delitem(sys.modules, f"{native.__name__}.package")
    fresh = importlib.import_module(f"{native.__name__}.package")
    assert fresh.read_ptn is not read_ptn, "the reader was not imported afresh"
    fresh.read_ptn(GOLDEN)


def test_shape_fits_declared_sizes() -> None:
    dim = type("Dim", (), {})

    def d(lo: int, hi: int) -> object:
        v = dim()
        v.min, v.max = lo, hi  # type: ignore[attr-defined]
        return v

    assert shape_fits([d(3, 3), d(1, -1)], (3, 1000))
    assert shape_fits([d(1, 8)], (8,)) and not shape_fits([d(1, 8)], (9,)) and not shape_fits([d(2, 8)], (1,))
    assert not shape_fits([d(3, 3)], (3, 1)) and shape_fits([], ())


# ---- more malformed headers and alias maps ------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "phrase"),
    [
        (b"[1, 2]", "expected a JSON object, got list"),
        (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {}}', "duplicate key 'a'"),
        (b"\xff\xfe not utf-8", "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "bad safetensors header"),
        (b'{"a": {"dtype": 3, "shape": [1], "data_offsets": [0, 4]}}', "dtype is not a string"),
        (b'{"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}', "non-negative ints"),
        (b'{"a": {"dtype": "F32", "shape": [true], "data_offsets": [0, 4]}}', "non-negative ints"),
        (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}', "data offsets out of range"),
        (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}', "is not [begin, end]"),
        (b'{"__metadata__": {"k": 1}}', "must map strings to strings"),
        (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}}', "exactly"),
    ],
)
def test_malformed_safetensors_header(tmp_path: Path, header: bytes, phrase: str) -> None:
    members = _golden_members()
    path = _write(
        tmp_path, "h.ptn", maker.replace(members, "program.safetensors", maker.join_st(header, bytes(4)))
    )
    with pytest.raises(PtnFormatError, match="program.safetensors|bad safetensors|data offsets") as info:
        read_ptn(path)
    assert phrase in str(info.value)


def test_overlapping_and_gapped_tensors(tmp_path: Path) -> None:
    members = _golden_members()
    entry = b'{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
    overlap = b'{"a":' + entry + b',"b":' + entry + b"}"
    gap = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
    for header, phrase in ((overlap, "overlaps another tensor"), (gap, "leaves a gap")):
        st = maker.join_st(header, bytes(8))
        path = _write(tmp_path, "o.ptn", maker.replace(members, "program.safetensors", st))
        with pytest.raises(PtnFormatError, match=phrase):
            read_ptn(path)


@pytest.mark.parametrize(
    ("aliases", "phrase"),
    [
        (b'{"two": 3}', "must be a JSON object of string to string"),
        (b"not json", "aliases.json is not valid JSON"),
        (b'{"two": "_lifted_tensor_constant2", "two": "count"}', "duplicate key 'two'"),
        (b'{"__metadata__": "count"}', "reserved by safetensors"),
        (b'{"two": "two"}', "alias cycle in aliases.json: two -> two"),
        (b'{"two": "a", "a": "b", "b": "a"}', "alias cycle"),
        (b'{"two": NaN}', "aliases.json is not valid JSON"),
    ],
)
def test_malformed_aliases(tmp_path: Path, aliases: bytes, phrase: str) -> None:
    path = _write(tmp_path, "a.ptn", maker.replace(_golden_members(), "aliases.json", aliases))
    with pytest.raises(PtnFormatError) as info:
        read_ptn(path)
    assert phrase in str(info.value)


def test_ptg_that_flatc_cannot_read(tmp_path: Path) -> None:
    members = _golden_members()
    ptg = maker.get(members, "program.ptg")
    broken = ptg[:8] + b"\xff" * 64  # right file identifier, garbage tables
    path = _write(tmp_path, "p.ptn", maker.replace(members, "program.ptg", broken))
    with pytest.raises(PtnFormatError, match="cannot deserialize program.ptg"):
        read_ptn(path)


@pytest.mark.parametrize("name", ["C:evil", "a/../../evil", "a\\..\\evil", "\\evil"])
def test_member_names_escaping(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path, "e.ptn", [*_golden_members(), (name, b"x", zipfile.ZIP_STORED)])
    with pytest.raises(PtnFormatError, match="escapes the package folder"):
        read_ptn(path)


def test_unknown_members_are_ignored(tmp_path: Path) -> None:
    path = _write(tmp_path, "x.ptn", [*_golden_members(), ("notes/readme.txt", b"hello", zipfile.ZIP_STORED)])
    assert read_ptn(path).aliases == {"two": "_lifted_tensor_constant2"}


def test_random_damage_never_escapes_as_another_error(tmp_path: Path) -> None:
    """Truncations and byte flips anywhere: the reader either succeeds or raises PtnFormatError."""
    golden = GOLDEN.read_bytes()
    rng = random.Random(1234)
    refused = 0
    for i in range(40):
        blob = bytearray(golden)
        if i % 4 == 0:
            blob = blob[: rng.randrange(len(blob))]
        else:
            for _ in range(rng.randint(1, 6)):
                blob[rng.randrange(len(blob))] = rng.randrange(256)
        path = tmp_path / f"r{i}.ptn"
        path.write_bytes(bytes(blob))
        try:
            read_ptn(path)
        except PtnFormatError:
            refused += 1
    assert refused > 20


def test_importable_without_executorch() -> None:
    code = (
        "import sys; sys.modules['executorch'] = None\n"
        "from pytest_ptn.backends.native.package import PtnFormatError, read_ptn\n"
        "e = PtnFormatError('p.ptn', 'what'); assert str(e) == 'p.ptn: what' and isinstance(e, ValueError)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
