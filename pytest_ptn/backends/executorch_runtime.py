"""ExecuTorch runtime backend options, set and read from Python.

The pybindings (executorch 1.5.1) have no binding for ``executorch::runtime::set_option``, yet the CUDA
delegate's ``weight_sharing_across_methods`` must be set before a program loads, as the C++ runners do. The
runtime lives in ``libexecutorch.so``, which the pybindings link dynamically, so calling its exported
functions through ctypes reaches the same backend registry the pybindings load programs with.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

from pytest_ptn import upstream_noise

# executorch::runtime::BackendOption: char key[64]; std::variant<bool, int, std::array<char, 256>> value.
_KEY_BYTES = 64
_STRING_BYTES = 256
_BOOL, _INT, _STRING = 0, 1, 2
"""The variant's index: which alternative it holds."""

_SET = "_ZN10executorch7runtime10set_optionEPKcNS0_4SpanINS0_13BackendOptionEEE"
_GET = "_ZN10executorch7runtime10get_optionEPKcNS0_4SpanINS0_13BackendOptionEEE"

_ERRORS = {
    0x01: "Internal",
    0x02: "InvalidState",
    0x10: "NotSupported",
    0x11: "NotImplemented",
    0x12: "InvalidArgument",
    0x13: "InvalidType",
    0x20: "NotFound (no backend registered under that name)",
}


class _BackendOption(ctypes.Structure):
    _fields_ = [
        ("key", ctypes.c_char * _KEY_BYTES),
        ("value", ctypes.c_ubyte * _STRING_BYTES),
        ("index", ctypes.c_ubyte),
        ("_padding", ctypes.c_ubyte * 3),
    ]


assert ctypes.sizeof(_BackendOption) == 324, "BackendOption layout changed"


class _Span(ctypes.Structure):
    _fields_ = [("data", ctypes.POINTER(_BackendOption)), ("length", ctypes.c_size_t)]


class BackendOptionError(RuntimeError):
    pass


Value = bool | int | str


def set_backend_option(backend: str, key: str, value: Value) -> None:
    """``set_option(backend, {key: value})``; raises BackendOptionError with the runtime's error."""
    option = _option(key)
    if isinstance(value, bool):
        option.index, option.value[0] = _BOOL, int(value)
    elif isinstance(value, int):
        option.index = _INT
        ctypes.memmove(option.value, ctypes.byref(ctypes.c_int32(value)), 4)
    else:
        raw = value.encode()
        if len(raw) >= _STRING_BYTES:
            raise ValueError(f"option {key!r}: a string value holds at most {_STRING_BYTES - 1} bytes")
        option.index = _STRING
        ctypes.memmove(option.value, raw, len(raw))
    _call(_SET, backend, option, f"set_option({backend!r}, {key}={value!r})")


def get_backend_option(backend: str, key: str, like: Value) -> Value:
    """The current value of ``key``, of the type of ``like`` (the runtime looks options up by key and type).

    A backend fills only the keys it knows: an unknown key reads back as zero, not as an error."""
    option = _option(key)
    option.index = _BOOL if isinstance(like, bool) else _INT if isinstance(like, int) else _STRING
    _call(_GET, backend, option, f"get_option({backend!r}, {key})")
    if option.index == _BOOL:
        return bool(option.value[0])
    if option.index == _INT:
        return ctypes.c_int32.from_buffer(option.value).value
    return bytes(option.value).split(b"\0", 1)[0].decode()


def _option(key: str) -> _BackendOption:
    raw = key.encode()
    if len(raw) >= _KEY_BYTES:
        raise ValueError(f"option key {key!r} is longer than {_KEY_BYTES - 1} bytes")
    option = _BackendOption()
    option.key = raw
    return option


def _call(symbol: str, backend: str, option: _BackendOption, what: str) -> None:
    fn = getattr(_runtime(), symbol)
    fn.restype = ctypes.c_uint32
    fn.argtypes = [ctypes.c_char_p, _Span]
    code = fn(backend.encode(), _Span(ctypes.pointer(option), 1))
    if code:
        raise BackendOptionError(f"{what} failed: error 0x{code:x} {_ERRORS.get(code, '')}".rstrip())


def _runtime() -> ctypes.CDLL:
    """libexecutorch.so as the pybindings loaded it: importing them first registers their backends."""
    with upstream_noise.contained():  # executorch's import-time notices are not the caller's concern
        from executorch.extension.pybindings import portable_lib  # noqa: F401

    spec = importlib.util.find_spec("executorch")
    assert spec is not None and spec.submodule_search_locations
    return ctypes.CDLL(str(Path(spec.submodule_search_locations[0]) / "lib" / "libexecutorch.so"))
