"""A child of the clean interpreter is a fresh interpreter for what isolation needs: nothing the asking
process holds reaches it, nothing one child does reaches the next, torch's thread pool works in it, a crash
ends the child alone, and nothing outlives the asking process."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import IO

import torch

from pytest_ptn.instruments.clean_interpreter import CleanInterpreter, clean_interpreter

HELD: dict[str, str] = {}
"""What this test module holds: the asking process fills it, a child must find it empty."""


def report(requests: IO[bytes], answers: IO[bytes]) -> None:
    """A child's target: what it finds in HELD, then writes there, and a multi-threaded matmul's result."""
    pickle.load(requests)
    found = dict(HELD)
    HELD["child"] = str(os.getpid())
    torch.set_num_threads(2)
    a = torch.ones(512, 512)
    pickle.dump((found, torch.get_num_threads(), float((a @ a)[0, 0])), answers)
    answers.flush()


def sleep(requests: IO[bytes], answers: IO[bytes]) -> None:
    """A child busy where no EOF reaches it (native code, a long lowering)."""
    time.sleep(3600)


def crash(requests: IO[bytes], answers: IO[bytes]) -> None:
    print("last words", flush=True)
    signal.raise_signal(signal.SIGSEGV)


def ask(interpreter: CleanInterpreter, target: str, log: Path) -> tuple[object, int]:
    child = interpreter.spawn(f"{__name__}:{target}", log)
    try:
        pickle.dump("go", child.requests)
        child.requests.flush()
        answer = pickle.load(child.answers)
    except (EOFError, OSError):  # a crash resets the socket
        answer = None
    return answer, child.wait()


def test_a_child_finds_nothing_the_asker_or_an_earlier_child_held(tmp_path: Path) -> None:
    HELD.clear()
    HELD["asker"] = "poison"
    interpreter = clean_interpreter()
    assert "torch" in interpreter.preloaded  # torch is imported here: the clean interpreter pays it once
    for n in range(2):
        answer, status = ask(interpreter, "report", tmp_path / f"{n}.log")
        assert answer == ({}, 2, 512.0) and status == 0, (answer, (tmp_path / f"{n}.log").read_text())
    assert HELD == {"asker": "poison"}


def test_a_crash_ends_the_child_alone_and_says_how(tmp_path: Path) -> None:
    interpreter = clean_interpreter()
    answer, status = ask(interpreter, "crash", tmp_path / "crash.log")
    assert answer is None and status == -signal.SIGSEGV
    assert "last words" in (tmp_path / "crash.log").read_text()
    assert ask(interpreter, "report", tmp_path / "after.log")[1] == 0


def test_nothing_outlives_the_asking_process(tmp_path: Path) -> None:
    """The asker dies without closing anything: the clean interpreter ends, and so does a busy child."""
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from pytest_ptn.instruments.clean_interpreter import clean_interpreter
        interpreter = clean_interpreter()
        log = {str(tmp_path / "c.log")!r}
        child = interpreter.spawn("test_clean_interpreter:sleep", __import__("pathlib").Path(log))
        print(interpreter.process.pid, child.pid, flush=True)
        os._exit(0)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2, done.stderr
    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids), pids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
