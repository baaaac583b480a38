"""The reference package's writer and reader: the streamed ``data.safetensors`` is what safetensors reads,
the bytes are deterministic, and reading goes tensor by tensor with every check kept (P9, P10, X2)."""

from __future__ import annotations

import io
import json
import os
import struct
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save

from pytest_ptn.reference import package, zipdata
from pytest_ptn.reference.package import Package, read_package, write_package
from pytest_ptn.reference.zipdata import PackageFormatError

BINDINGS = {"m": {"inputs": [{"kind": "constant", "key": "w", "final": "m/w"}], "outputs": []}}


def mixed() -> dict[str, torch.Tensor]:
    """One tensor of every storable element size, and layouts the writer must flatten."""
    g = torch.Generator().manual_seed(0)
    return {
        "m/w": torch.rand(3, 5, generator=g),
        "m/t": torch.rand(5, 3, generator=g).t(),  # not contiguous
        "m/d": torch.rand(4, dtype=torch.float64, generator=g),
        "m/h": torch.rand(6, generator=g).half(),
        "m/b": torch.rand(2, 2, generator=g).bfloat16(),
        "m/i": torch.arange(-3, 3, dtype=torch.int64),
        "m/u": torch.arange(5, dtype=torch.uint8),
        "m/f": torch.tensor([True, False, True]),
        "m/s": torch.tensor(2.5),  # 0-dim
        "m/e": torch.empty(0, 3),  # no bytes
        "state/kv": torch.zeros(4, dtype=torch.int32),
    }


def write(tmp_path: Path, tensors: dict[str, torch.Tensor], name: str = "p.ptpkg") -> Path:
    path = tmp_path / name
    write_package(path, Package(tensors, {"m/alias": "m/w"}, BINDINGS, ["state/kv"]))
    return path


def data_member(path: Path) -> bytes:
    with zipfile.ZipFile(path) as z:
        return z.read(package.DATA)


def test_the_streamed_member_is_what_safetensors_reads(tmp_path: Path) -> None:
    tensors = mixed()
    member = tmp_path / "data.safetensors"
    member.write_bytes(data_member(write(tmp_path, tensors)))
    with safe_open(str(member), framework="pt") as f:
        assert sorted(f.keys()) == sorted(tensors)
        assert f.metadata() == {"state_keys": '["state/kv"]'}
        for key, t in tensors.items():
            got = f.get_tensor(key)
            assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t), key


def test_data_is_aligned_by_element_size(tmp_path: Path) -> None:
    raw = data_member(write(tmp_path, mixed()))
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    assert next(iter(header)) == "__metadata__"
    for key, entry in header.items():
        if key != "__metadata__":
            assert entry["data_offsets"][0] % zipdata.DTYPE_SIZES[entry["dtype"]] == 0, key


def test_one_dtype_is_byte_for_byte_what_safetensors_saves(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    tensors = {f"m/{k}": torch.rand(k + 1, 3, generator=g) for k in range(12)} | {"state/kv": torch.zeros(4)}
    expected = save({k: t for k, t in tensors.items()}, metadata={"state_keys": '["state/kv"]'})
    assert data_member(write(tmp_path, tensors)) == expected


def test_same_package_same_bytes_whatever_the_insertion_order(tmp_path: Path) -> None:
    tensors = mixed()
    first = write(tmp_path, tensors, "a.ptpkg").read_bytes()
    second = write(tmp_path, dict(reversed(list(tensors.items()))), "b.ptpkg").read_bytes()
    assert first == second


def test_read_back_tensor_by_tensor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small chunk makes most tensors span several reads."""
    monkeypatch.setattr(zipdata, "READ_CHUNK", 7)
    tensors = mixed()
    back = read_package(write(tmp_path, tensors))
    assert back.tensors.keys() == tensors.keys()
    for key, t in tensors.items():
        got = back.tensors[key]
        assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t), key
        assert got.is_contiguous()
    assert back.aliases == {"m/alias": "m/w"} and back.state_keys == ["state/kv"]
    assert len({t.untyped_storage().data_ptr() for t in back.tensors.values() if t.numel()}) == 10


def test_a_flipped_byte_in_the_last_chunk_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CRC is checked only once the member's last byte is read: past every tensor already filled."""
    monkeypatch.setattr(zipdata, "READ_CHUNK", 64)
    blob = bytearray(write(tmp_path, {"m/w": torch.rand(4096), "state/kv": torch.zeros(4)}).read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(blob))) as z:
        info = z.getinfo(package.DATA)
        end = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.file_size
    blob[end - 20] ^= 0x01  # inside the last tensor's bytes
    damaged = tmp_path / "damaged.ptpkg"
    damaged.write_bytes(bytes(blob))
    with pytest.raises(PackageFormatError, match=r"zip member 'data\.safetensors' is corrupt: Bad CRC-32"):
        read_package(damaged)


def test_zip64_is_declared_up_front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The member's size is known before its first byte, so zipfile writes zip64 headers when the member
    will pass the zip limit; streaming without declaring the size fails at that limit (as write_ptn of
    executorch 1.5.1 does past 4 GiB). The limit is lowered so that a small package crosses it."""
    w = torch.rand(1024)
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 1024)
    path = write(tmp_path, {"m/w": w, "state/kv": torch.zeros(4)})
    monkeypatch.undo()
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(package.DATA)
        assert info.file_size > 1024
        assert struct.unpack("<H", info.extra[:2]) == (1,)  # the zip64 extra field
    assert torch.equal(read_package(path).tensors["m/w"], w)


def test_unstorable_dtype_is_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="safetensors cannot store dtype torch.complex128"):
        write(tmp_path, {"m/w": torch.zeros(2, dtype=torch.complex128), "state/kv": torch.zeros(4)})
    assert list(tmp_path.iterdir()) == []  # P10: nothing left behind


# ---- damaged packages the adversarial run found (issue 13) ----------------------------------------


def rezip(path: Path, member: str, edit: Callable[[bytes], bytes]) -> Path:
    """A copy of the package at ``path`` with ``member``'s bytes replaced by ``edit(bytes)``."""
    with zipfile.ZipFile(path) as z:
        members = [(info, z.read(info)) for info in z.infolist()]
    damaged = path.with_name(f"damaged-{path.name}")
    with zipfile.ZipFile(damaged, "w") as z:
        for info, data in members:
            z.writestr(info, edit(data) if info.filename == member else data)
    return damaged


def edit_header(edit: Callable[[dict[str, Any]], None]) -> Callable[[bytes], bytes]:
    """A member edit applying ``edit`` to a safetensors header, data kept."""

    def apply(st: bytes) -> bytes:
        (n,) = struct.unpack("<Q", st[:8])
        header = json.loads(st[8 : 8 + n])
        edit(header)
        raw = json.dumps(header).encode()
        return struct.pack("<Q", len(raw)) + raw + st[8 + n :]

    return apply


@pytest.mark.parametrize("shape", [[2**63, 0], [2**62, 2**62, 0], [0, 2**40, 2**40, 2**40], [2**61, 0]])
def test_an_empty_tensor_with_huge_dimensions_is_refused(tmp_path: Path, shape: list[int]) -> None:
    """Zero bytes pass the size check whatever the other dimensions are; torch cannot even describe these
    (its strides and storage size are int64 bytes), so they escaped as its TypeError/RuntimeError."""

    def huge(header: dict[str, Any]) -> None:
        header["m/e"]["shape"] = shape  # F32: [2**61, 0] spans 2**63 bytes, one past int64

    path = rezip(write(tmp_path, mixed()), package.DATA, edit_header(huge))
    with pytest.raises(PackageFormatError, match=r"tensor 'm/e' shape .* is too large"):
        read_package(path)


def test_an_empty_tensor_with_large_dimensions_reads(tmp_path: Path) -> None:
    def large(header: dict[str, Any]) -> None:
        header["m/e"]["shape"] = [2**40, 2**20, 0]

    back = read_package(rezip(write(tmp_path, mixed()), package.DATA, edit_header(large)))
    assert back.tensors["m/e"].shape == (2**40, 2**20, 0)


def central_directory_edit(blob: bytes, at: int, value: bytes) -> bytes:
    """``blob`` with ``value`` written at offset ``at`` of every central directory entry."""
    out = bytearray(blob)
    start = out.find(b"PK\x01\x02")
    while start >= 0:
        out[start + at : start + at + len(value)] = value
        start = out.find(b"PK\x01\x02", start + 4)
    return bytes(out)


@pytest.mark.parametrize(
    ("at", "value", "phrase"),
    [
        (6, struct.pack("<H", 0xFFFF), "unsupported zip feature"),  # version needed to extract
        (8, struct.pack("<H", 1 << 5), "unsupported zip feature"),  # compressed patched data
        (8, struct.pack("<H", 1 << 6), "unsupported zip feature"),  # strong encryption
        (8, struct.pack("<H", 1), "is encrypted"),
    ],
)
def test_an_unsupported_zip_feature_is_refused(tmp_path: Path, at: int, value: bytes, phrase: str) -> None:
    """zipfile raises NotImplementedError for these: the reader's documented error is PackageFormatError."""
    path = write(tmp_path, mixed())
    path.write_bytes(central_directory_edit(path.read_bytes(), at, value))
    with pytest.raises(PackageFormatError, match=phrase):
        read_package(path)


def test_a_long_alias_chain_is_refused_in_linear_time(tmp_path: Path) -> None:
    """Walked in quadratic time, 64k links took minutes; the walk is linear, so this takes milliseconds."""
    links = 100_000
    chain = {f"a{i}": f"a{i + 1}" for i in range(links)} | {f"a{links}": "m/w"}
    path = rezip(write(tmp_path, mixed()), package.ALIASES, lambda _: json.dumps(chain).encode())
    start = time.monotonic()
    with pytest.raises(PackageFormatError, match="'a0' names 'a1', which is itself an alias"):
        read_package(path)
    assert time.monotonic() - start < 10


def test_a_long_alias_cycle_is_named(tmp_path: Path) -> None:
    links = 100_000
    cycle = {f"a{i}": f"a{(i + 1) % links}" for i in range(links)}
    path = rezip(write(tmp_path, mixed()), package.ALIASES, lambda _: json.dumps(cycle).encode())
    start = time.monotonic()
    with pytest.raises(PackageFormatError, match=r"alias cycle in aliases.json: a0 -> a1 -> .* -> a0$"):
        read_package(path)
    assert time.monotonic() - start < 10


def test_too_many_tensors_are_refused_before_allocating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Zero-byte entries cost nothing in the data section but a tensor each: their number is bounded."""
    tensors = mixed()
    path = write(tmp_path, tensors)
    assert zipdata.MAX_TENSORS >= 100_000  # generous: a package of a large model still reads
    monkeypatch.setattr(zipdata, "MAX_TENSORS", len(tensors) - 1)
    allocated: list[object] = []
    monkeypatch.setattr(torch, "empty", lambda *a, **k: allocated.append(a))
    with pytest.raises(PackageFormatError, match="too many tensors in data.safetensors: more than"):
        read_package(path)
    assert not allocated
    monkeypatch.setattr(zipdata, "MAX_TENSORS", len(tensors))
    monkeypatch.undo()
    assert read_package(path).tensors.keys() == tensors.keys()


# ---- temporaries of killed writes --------------------------------------------------------------------


def test_a_save_removes_stale_temporaries_of_its_target(tmp_path: Path) -> None:
    """A killed save leaves its temporary behind; the next save into the folder removes those older than
    a run, and only those of its own target: a fresh one may belong to a live concurrent writer."""
    old = time.time() - package.STALE_TEMPORARY_S - 60
    stale = tmp_path / ".p.ptpkg.abc_1234"
    live = tmp_path / ".p.ptpkg.xyz_9876"
    other_target = tmp_path / ".q.ptpkg.abc_1234"
    not_a_temporary = tmp_path / ".p.ptpkg.backup"
    for f in (stale, live, other_target, not_a_temporary):
        f.write_bytes(b"partial")
    for f in (stale, other_target, not_a_temporary):
        os.utime(f, (old, old))
    write(tmp_path, mixed())
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted(
        ["p.ptpkg", live.name, other_target.name, not_a_temporary.name]
    )
