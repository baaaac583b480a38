"""Judging each drawn program in a child process of its own, for a backend known to crash or hang on some.

Where a backend's expectations list a ``crash:`` or ``hang:`` mechanism (openvino 2026 dies with SIGSEGV at
the first call of a stateful program), a known crash must cost its program only and the fuzz go on: the
program is lowered, loaded and run in a child forked from this process's clean interpreter
(pytest_ptn.instruments.clean_interpreter, as the methods alone are), which tells each step as it starts and
sends the verdict back. A child that dies gives ``crash:<step>:<signal>``; one that says nothing for the run's
hang limit is killed and gives ``hang:<step>``. Either is then a mechanism like any other: counted when
listed, failing the test when not. Every other backend is judged in the test's own process, where a crash is
the worker's (pytest_ptn.scheduling.crashes) and fails the test naming the step and the program.

A child starts cold: the first lowering in a process pays torch's one-time costs, and a program whose value
is wrong asks for the methods alone in a clean interpreter of the child's own; so this is for the backends
that need it, never the default.
"""

from __future__ import annotations

import pickle
import traceback
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from pytest_ptn.fuzzing.verdict import Verdict, verdict_on
from pytest_ptn.instruments.clean_interpreter import InterpreterGone, clean_interpreter
from pytest_ptn.instruments.process_end import ProcessEnd
from pytest_ptn.mechanisms import Kind, Step, crashed, hung

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_ptn.backend import Backend
    from pytest_ptn.spec import ProgramSpec

OUTPUT_TAIL = 20
"""Lines of a dead child's output its verdict quotes."""


def dies_on_some(listed: set[str]) -> bool:
    """Whether the backend's expectations list a crash or a hang: its programs are then judged apart."""
    return any(key.partition(":")[0] in (Kind.CRASH.value, Kind.HANG.value) for key in listed)


def verdict_in_child(
    backend: Backend,
    spec: ProgramSpec,
    workdir: Path,
    limit: float,
    entering: Callable[[Step], None] = lambda step: None,
) -> Verdict:
    """``judge`` in a child: its verdict, or the crash or hang (``limit`` seconds without a word; 0: none)
    at the step it was in. ``entering`` is told each step the child starts."""
    from pytest_ptn.check.alone import class_reference

    log = workdir / "child.log"
    try:
        child = clean_interpreter().spawn(f"{__name__}:{_serve.__name__}", log)
    except InterpreterGone as e:
        raise RuntimeError(f"the fuzz cannot judge a program apart: {e}") from e
    child.answer_within(limit)
    step = Step.LOWERING
    try:
        pickle.dump((class_reference(type(backend)), spec, str(workdir)), child.requests)
        child.requests.flush()
        while True:
            kind, value = pickle.load(child.answers)
            if kind == "verdict":
                child.wait()
                verdict: Verdict = value
                return verdict
            if kind == "error":  # the suite's own failure in the child, not the backend's
                child.wait()
                raise RuntimeError(f"judging a program apart failed:\n{value}")
            step = Step(value)
            entering(step)
    except TimeoutError:
        child.kill()
        child.wait()
        said = f"no word for {limit:g} s"
        mechanism = hung(step, said)
    except (EOFError, OSError, pickle.UnpicklingError):
        end = ProcessEnd.of(child.wait())
        said = str(end)
        mechanism = crashed(step, end)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-OUTPUT_TAIL:]) if log.exists() else ""
    output = f"; its last output:\n{tail}" if tail else ""
    return Verdict((mechanism,), f"the program's process {said} while {step.value}{output}")


def _serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """The child's side: judge the program it is given, telling each step as it starts."""
    from pytest_ptn.check.alone import referenced_class

    reference, spec, workdir = pickle.load(requests)

    def send(kind: str, value: Any) -> None:
        pickle.dump((kind, value), answers)
        answers.flush()

    try:
        cls = referenced_class(reference)
        cls.load_runtime()
        verdict = verdict_on(cls(), spec, Path(workdir), lambda step: send("step", step.value))
    except Exception:
        send("error", traceback.format_exc())
        return
    send("verdict", verdict)
