"""The reference package's writer and reader: the streamed ``data.safetensors`` is what safetensors reads,
the bytes are deterministic, and reading goes tensor by tensor with every check kept (P9, P10, X2)."""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save

from pytest_ptn import package, zipdata
from pytest_ptn.package import Package, read_package, write_package
from pytest_ptn.zipdata import PackageFormatError

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
