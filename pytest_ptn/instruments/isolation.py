"""Run a call in a fresh interpreter, so a segfault or abort in native code fails one test, not the run.

A child is a new ``python`` (never a fork of this process: torch's and XNNPACK's thread pools, started by
its runs, do not survive one), so each call pays the child's imports: about 10 s when it imports executorch
(measured on 2 cores); clean_interpreter forks children that do not. Use it where a crash is plausible,
not around everything. The call travels pickled through a file; a crash keeps that file and names the shell
command that replays it (``python -m pytest_ptn.instruments.isolation CALL ANSWER``).
"""

from __future__ import annotations

import os
import pickle
import shlex
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pytest_ptn.instruments.process_end import ProcessEnd

T = TypeVar("T")

OUTPUT_TAIL = 20
"""Lines of the child's output a ChildCrashed message keeps: native code logs its last words there."""


class ChildCrashed(RuntimeError):
    """The child died without answering; the message names the signal and a command that replays the call."""

    def __init__(self, how: str, returncode: int, command: str, output: str):
        self.how = how
        self.returncode = returncode
        self.command = command
        self.output = output
        tail = "\n".join(output.splitlines()[-OUTPUT_TAIL:])
        said = f"\nlast output:\n{tail}" if tail else ""
        super().__init__(f"child process {how}; reproduce with:\n  {command}{said}")


class RemoteTraceback(Exception):
    """The child's traceback, chained under the exception it raised (its own frames are lost in pickling)."""


def run_isolated(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a child interpreter: its result, its exception re-raised here, or ChildCrashed.

    ``fn`` and ``args`` must pickle (a module-level function, plain data); so must what it returns.
    """
    workdir = Path(tempfile.mkdtemp(prefix="ptn-isolated-"))
    call, answer = workdir / "call.pkl", workdir / "answer.pkl"
    with call.open("wb") as f:
        pickle.dump([p for p in sys.path if p], f)
        pickle.dump((fn, args), f)
    argv = [sys.executable, "-X", "faulthandler", "-m", __name__, str(call), str(answer)]
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    if not answer.exists():
        replay = f"cd {shlex.quote(os.getcwd())} && {shlex.join(argv[:-1])} /dev/null"
        raise ChildCrashed(str(ProcessEnd.of(done.returncode)), done.returncode, replay, done.stdout)
    with answer.open("rb") as f:
        outcome = pickle.load(f)
    shutil.rmtree(workdir)
    if outcome[0] == "ok":
        return outcome[1]
    if outcome[0] == "raised":
        raise outcome[1] from RemoteTraceback(outcome[2])
    raise RuntimeError(f"the child's answer {outcome[1]} does not pickle:\n{outcome[2]}")


def _child(call: str, answer: str) -> None:
    """The child's side: load the call, run it, pickle what happened (a crash writes nothing)."""
    with open(call, "rb") as f:
        sys.path[:0] = pickle.load(f)
        fn, args = pickle.load(f)
    outcome: tuple[Any, ...]
    try:
        outcome = ("ok", fn(*args))
    except BaseException as e:
        outcome = ("raised", e, traceback.format_exc())
    with open(answer, "wb") as f:
        try:
            pickle.dump(outcome, f)
        except Exception:
            f.seek(0)
            f.truncate()
            pickle.dump(("unpicklable", repr(outcome[1]), traceback.format_exc()), f)


if __name__ == "__main__":
    _child(*sys.argv[1:3])
