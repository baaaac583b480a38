"""Fresh interpreters at the cost of a fork: a clean process imports the heavy frameworks once, runs nothing,
and forks one child per request.

A child forked from it is as fresh as a new ``python`` for what matters to isolation: the clean process never
lowered, loaded or ran anything, so no cache (module-level, class-level, a runtime's per-process one) holds an
entry, and no thread pool has started (torch's and XNNPACK's pools, which do not survive a fork, start at a
first run). It only skips the imports, about 2.5 s for torch and 8 s with executorch on 2 cores, which a new
interpreter per method alone paid each time. What the clean process imports is what the asking process has
imported of ``PRELOADED``, in the same order; a child imports the rest (a backend's own module among them, so
an edited test module is never stale).

A child talks through one socket, handed over with the request; its output goes to a log file; its exit
status is the clean process's to reap, and so to report.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

PRELOADED = ("torch", "torchao", "executorch")
"""The frameworks whose imports a clean interpreter pays once: every lowering imports them, and importing them
starts no thread and fills no cache."""
MESSAGE_LIMIT = 1 << 20
"""The largest request the clean interpreter reads (a child's target, log path, environment, sys.path)."""
PR_SET_PDEATHSIG = 1
"""prctl(2)'s option: the signal a process gets when its parent ends."""
REAPED_WAIT_S = 30.0
"""How long a child that closed its socket may take to exit before the clean interpreter kills it."""


class InterpreterGone(RuntimeError):
    """The clean interpreter ended or cannot start: the message carries its last output."""


class CleanInterpreter:
    """A clean process that forks children: each runs ``module:function(requests, answers)`` on its socket.

    ``preload``: the modules it imports once, before any child."""

    def __init__(self, preload: Sequence[str]):
        self.preloaded = list(preload)
        self._lock = threading.Lock()
        self._output = tempfile.TemporaryFile()  # noqa: SIM115 (it lives as long as the process)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        root = str(Path(__file__).parents[2])  # this package, importable before the child reads sys.path
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "-m", __name__, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=self._output,
            stderr=self._output,
            env=env,
        )
        theirs.close()
        self._control = ours
        self._ask(("preload", [p for p in sys.path if p], self.preloaded))

    def spawn(self, target: str, log: Path) -> Child:
        """A child running ``target`` (``module:function``) with this process's environment and sys.path, its
        output written to ``log``."""
        ours, theirs = socket.socketpair()
        try:
            pid = self._ask(("spawn", target, str(log), dict(os.environ), [p for p in sys.path if p]), theirs)
        finally:
            theirs.close()
        return Child(self, pid, ours)

    def exit_status(self, pid: int) -> int:
        """How child ``pid`` ended, as ``Popen.returncode`` says it (a signal negative); waits for it."""
        status: int = self._ask(("wait", pid))
        return status

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._control.close()
        try:
            self.process.wait(timeout=REAPED_WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._output.close()

    def _ask(self, request: tuple[Any, ...], handed: socket.socket | None = None) -> Any:
        with self._lock:
            try:
                socket.send_fds(self._control, [pickle.dumps(request)], [handed.fileno()] if handed else [])
                answer, _, _, _ = socket.recv_fds(self._control, MESSAGE_LIMIT, 0)
            except OSError as e:
                raise InterpreterGone(self._last_words(f"cannot reach it ({e})")) from e
            if not answer:
                raise InterpreterGone(self._last_words("it ended"))
            outcome, value = pickle.loads(answer)
            if outcome != "ok":
                raise InterpreterGone(self._last_words(value))
            return value

    def _last_words(self, what: str) -> str:
        self._output.seek(0)
        tail = self._output.read().decode(errors="replace").strip().splitlines()[-20:]
        said = "; its last output:\n" + "\n".join(tail) if tail else ""
        return f"the clean interpreter: {what}{said}"


class Child:
    """One forked child: its pickled protocol's two streams, and how it ended."""

    def __init__(self, interpreter: CleanInterpreter, pid: int, channel: socket.socket):
        self.pid = pid
        self._interpreter = interpreter
        self._channel = channel
        self.requests: IO[bytes] = channel.makefile("wb")
        self.answers: IO[bytes] = channel.makefile("rb")
        self.returncode: int | None = None

    def wait(self) -> int:
        """The child's exit status, once it has ended (killed if it outlives its socket by REAPED_WAIT_S)."""
        if self.returncode is None:
            self.close_channel()
            try:
                self.returncode = self._interpreter.exit_status(self.pid)
            except InterpreterGone:
                self.kill()
                self.returncode = -signal.SIGKILL
        return self.returncode

    def answer_within(self, seconds: float) -> None:
        """A read of ``answers`` waiting longer than ``seconds`` raises TimeoutError (0: it waits forever)."""
        self._channel.settimeout(seconds or None)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def close_channel(self) -> None:
        for stream in (self.requests, self.answers, self._channel):
            with contextlib.suppress(OSError):  # what the child never read
                stream.close()


_INTERPRETERS: dict[tuple[str, ...], CleanInterpreter] = {}
_INTERPRETERS_LOCK = threading.Lock()


def clean_interpreter() -> CleanInterpreter:
    """This process's clean interpreter for what it has imported of ``PRELOADED`` (one per such set: a run
    that only ever used torch does not wait for executorch), started at its first need."""
    loaded = [name for name in list(sys.modules) if name.partition(".")[0] in PRELOADED]
    key = tuple(sorted({name.partition(".")[0] for name in loaded}))
    with _INTERPRETERS_LOCK:
        found = _INTERPRETERS.get(key)
        if found is None or not found.alive():
            if found is not None:
                found.close()
            if not _INTERPRETERS:
                atexit.register(_close_all)
            found = _INTERPRETERS[key] = CleanInterpreter(
                [n for n in loaded if sys.modules.get(n) is not None]
            )
        return found


def _close_all() -> None:
    with _INTERPRETERS_LOCK:
        for interpreter in _INTERPRETERS.values():
            interpreter.close()
        _INTERPRETERS.clear()


def _serve(control: socket.socket) -> None:
    """The clean interpreter's side: import what it is told, then fork a child per request until EOF."""
    ended: dict[int, int] = {}

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            ended[pid] = os.waitstatus_to_exitcode(status)

    def wait(pid: int) -> int:
        deadline = time.monotonic() + REAPED_WAIT_S
        while pid not in ended:
            reap()
            if pid in ended:
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                ended[pid] = os.waitstatus_to_exitcode(status)
            else:
                time.sleep(0.01)
        return ended.pop(pid)

    while True:
        message, fds, _, _ = socket.recv_fds(control, MESSAGE_LIMIT, 1)
        if not message:
            return
        request = pickle.loads(message)
        reap()
        try:
            if request[0] == "preload":
                _, paths, modules = request
                sys.path[:0] = [p for p in paths if p not in sys.path]
                for name in modules:
                    with contextlib.suppress(Exception):
                        importlib.import_module(name)
                value: Any = None
            elif request[0] == "spawn":
                value = _fork(control, fds[0], *request[1:])
            else:
                value = wait(request[1])
            answer = ("ok", value)
        except Exception as e:
            answer = ("error", f"{type(e).__name__}: {e}")
        finally:
            for fd in fds:
                os.close(fd)
        control.send(pickle.dumps(answer))


def _fork(
    control: socket.socket, fd: int, target: str, log: str, env: dict[str, str], paths: list[str]
) -> int:
    """Fork a child that runs ``target`` on the socket ``fd``; its pid (in the clean interpreter)."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        _end_with_parent()
        control.close()
        output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.environ.clear()
        os.environ.update(env)
        sys.path[:0] = [p for p in paths if p not in sys.path]
        channel = socket.socket(fileno=os.dup(fd))
        module, _, function = target.partition(":")
        getattr(importlib.import_module(module), function)(channel.makefile("rb"), channel.makefile("wb"))
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _end_with_parent() -> None:
    """Have the kernel kill this child when the clean interpreter ends (which it does when the asker does): a
    child busy in native code never outlives the run. Linux only; elsewhere a child ends at its socket's
    EOF."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the clean interpreter ended before the call
            os._exit(1)


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])))
