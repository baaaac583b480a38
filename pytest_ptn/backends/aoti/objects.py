"""Compiled AOTI wrapper objects, cached on disk by their source and command line.

g++ on a method's ``*.wrapper.cpp`` (the AOTI runtime and the calls into the kernels) is about 80% of an
AOTInductor compile on the CPU (4 s of 5 s once inductor has warmed up), and that source holds neither
constant values (those are in the blob, or inlined into the kernels) nor paths: methods that differ in
constant values only, inlined ones included, share it. While inductor compiles, such a build copies the
object an identical earlier build left; the kernels and the link run as inductor builds them. An object
file ends with the sha256 of its bytes, so a damaged one is built again, never linked.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

OBJECTS = "objects"
"""Under the cache root: wrapper objects by a hash of what compiled them."""
DIGEST_BYTES = 32

log = logging.getLogger(__name__)


_root: ContextVar[Path | None] = ContextVar("aoti_wrapper_objects", default=None)
"""The cache root of the compile running in this thread, if any."""
_install = threading.Lock()


@contextmanager
def wrapper_objects(root: Path) -> Iterator[None]:
    """Inductor's compile-only builds of a ``*.wrapper.cpp`` in this thread served from ``root``, for the
    duration. The hook stays installed; a build outside any such block, or in another thread, passes."""
    _install_hook()
    token = _root.set(root)
    try:
        yield
    finally:
        _root.reset(token)


def _install_hook() -> None:
    from torch._inductor.cpp_builder import CppBuilder

    with _install:
        build = CppBuilder.build
        if getattr(build, "ptn_wrapper_objects", False):
            return

        def cached_build(builder: CppBuilder) -> None:
            root = _root.get()
            if root is None:
                return build(builder)
            command: str = builder.get_command_line()
            target = Path(builder.get_target_file_path())
            words = command.split()
            sources = [w for w in words if w.endswith(".wrapper.cpp")]
            if len(sources) != 1 or "-c" not in words or target.suffix != ".o":
                return build(builder)
            source = Path(sources[0])
            stored = root / OBJECTS / _key(source, command, target)
            if not _restore(stored, target):
                build(builder)
                _store(target, stored)

        cached_build.ptn_wrapper_objects = True  # type: ignore[attr-defined]
        CppBuilder.build = cached_build  # type: ignore[method-assign,assignment]


def _key(source: Path, command: str, target: Path) -> str:
    """What decides the object: the source, the command with its two paths reduced to their file names
    (which inductor derives from a hash of the source), the compiler binary and the torch headers."""
    import torch

    compiler = shutil.which(command.split()[0])
    stat = os.stat(compiler) if compiler else None
    h = hashlib.sha256()
    for part in (
        torch.__version__,
        compiler,
        stat and (stat.st_size, stat.st_mtime_ns),
        command.replace(str(source), source.name).replace(str(target), target.name),
    ):
        h.update(f"{part}\0".encode())
    h.update(source.read_bytes())
    key = h.hexdigest()
    return f"{key[:2]}/{key}.o"


def _restore(stored: Path, target: Path) -> bool:
    try:
        data = stored.read_bytes()
    except FileNotFoundError:
        return False
    body, digest = data[:-DIGEST_BYTES], data[-DIGEST_BYTES:]
    if len(data) <= DIGEST_BYTES or hashlib.sha256(body).digest() != digest:
        log.warning("AOTI wrapper object %s does not match its digest; compiling it again", stored)
        return False
    target.write_bytes(body)
    return True


def _store(target: Path, stored: Path) -> None:
    """Written under a temporary name and renamed: concurrent builds each publish a whole file."""
    data = target.read_bytes()
    stored.parent.mkdir(parents=True, exist_ok=True)
    tmp = stored.with_name(f".tmp-{uuid.uuid4().hex}")
    tmp.write_bytes(data + hashlib.sha256(data).digest())
    os.replace(tmp, stored)
