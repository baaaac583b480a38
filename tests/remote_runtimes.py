"""A runtime of .pte files in another interpreter (pytest_ptn.backends.pte_runtime): ``load_pte`` hands the
.pte's bytes, and its .ptd's, to a worker process, which runs them with executorch.runtime and sends each
call's outputs back. The suite judges it as it judges a runtime in its own process
(tests/test_pte_runtime.py). Run as a script, this file is the worker."""

from __future__ import annotations

import itertools
import os
import pickle
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from pytest_ptn.backends.pte_runtime import PteRuntime


class Worker:
    """The other interpreter: requests and answers pickled through its standard input and output, each
    loaded .pte a handle there. It ends when this process closes its input."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # the runtime's own log lines
        )

    def ask(self, *request: Any) -> Any:
        """Send a request and wait for its answer; RuntimeError with what the worker raised."""
        assert self.process.stdin is not None and self.process.stdout is not None
        pickle.dump(request, self.process.stdin)
        self.process.stdin.flush()
        try:
            ok, value = pickle.load(self.process.stdout)
        except EOFError:
            raise RuntimeError(f"the runtime's worker exited with status {self.process.wait()}") from None
        if not ok:
            raise RuntimeError(f"in the runtime's worker: {value}")
        return value

    def release(self, handle: int) -> None:
        """Forget a loaded .pte (no answer)."""
        if self.process.poll() is None and self.process.stdin is not None:
            pickle.dump(("release", handle), self.process.stdin)
            self.process.stdin.flush()


_worker: Worker | None = None


def worker() -> Worker:
    """This process's worker, started at the first load."""
    global _worker
    if _worker is None or _worker.process.poll() is not None:
        _worker = Worker()
    return _worker


class RemoteProgram:
    """One .pte loaded in the worker: what ``load_pte`` returns."""

    def __init__(self, program: Path, data: Path | None):
        self.worker = worker()
        self.handle = self.worker.ask("load", program.read_bytes(), data.read_bytes() if data else None)
        weakref.finalize(self, self.worker.release, self.handle).atexit = False

    def load_method(self, method: str) -> None:
        self.worker.ask("load_method", self.handle, method)

    def run(self, method: str, inputs: list[Any]) -> Sequence[Any]:
        answer: Sequence[Any] = self.worker.ask("run", self.handle, method, inputs)
        return answer


class RemoteRuntime(PteRuntime):
    """executorch.runtime in another interpreter: every failure it gets is the lowering's, or upstream's."""

    name = "remote-runtime"

    def load_pte(self, program: Path, data: Path | None) -> RemoteProgram:
        return RemoteProgram(program, data)


class _HandlePerMethod:
    """Loads each method from a .pte handle of its own: buffers the lowering planned as one are one per
    method."""

    def __init__(self, program: Path, data: Path | None):
        self.files = (program, data)
        self.methods: dict[str, RemoteProgram] = {}

    def load_method(self, method: str) -> None:
        if method not in self.methods:
            self.methods[method] = RemoteProgram(*self.files)
        self.methods[method].load_method(method)

    def run(self, method: str, inputs: list[Any]) -> Sequence[Any]:
        self.load_method(method)
        return self.methods[method].run(method, inputs)


class RemoteIgnoresSharedBuffers(PteRuntime):
    """The proxy ignores ``share_mutable_buffers=True``: decode never sees prefill's cache writes."""

    name = "remote-ignores-shared-buffers"

    def load_pte(self, program: Path, data: Path | None) -> _HandlePerMethod:
        return _HandlePerMethod(program, data)


def serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """The worker's side: load, load_method, run and release, until its input closes."""
    from executorch.runtime import Runtime

    runtime, handles = Runtime.get(), itertools.count()
    programs: dict[int, Any] = {}
    methods: dict[tuple[int, str], Any] = {}

    def method(handle: int, name: str) -> Any:
        if (handle, name) not in methods:
            methods[handle, name] = programs[handle].load_method(name)
        return methods[handle, name]

    def answer(kind: str, args: list[Any], folder: Path) -> Any:
        if kind == "load":
            pte, ptd = args
            handle, data = next(handles), None
            if ptd is not None:
                data = folder / f"{handle}.ptd"
                data.write_bytes(ptd)
            programs[handle] = runtime.load_program(pte, data_path=data)
            return handle
        if kind == "load_method":
            method(*args)
            return None
        handle, name, inputs = args
        return [t.clone() for t in method(handle, name).execute(inputs)]

    with tempfile.TemporaryDirectory() as folder:
        while True:
            try:
                kind, *args = pickle.load(requests)
            except EOFError:
                return
            if kind == "release":
                programs.pop(args[0])
                for key in [k for k in methods if k[0] == args[0]]:
                    del methods[key]
                continue
            try:
                reply = (True, answer(kind, args, Path(folder)))
            except Exception as e:
                reply = (False, f"{type(e).__name__}: {e}")
            pickle.dump(reply, answers)
            answers.flush()


if __name__ == "__main__":
    # the protocol owns the real standard input and output; what the runtime prints goes to standard error
    _requests, _answers = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(_requests, _answers)
