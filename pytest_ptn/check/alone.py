"""What a backend computes for each method of a program alone: the truth isolation is judged against.

A backend's kernels may compute differently from eager (XNNPACK's float32 kernels, OpenVINO's float32 in
bf16, AOTInductor's fused float32 chains in a bf16 program): that is arithmetic, not isolation. The truth for
isolation is the same backend on the program with the hazard removed: each method lowered alone (one method
per program), its state explicit (pytest_ptn.programs.stateless), and the calls threaded through it, each
call given the state the backend's own previous call alone produced. A method of the program that differs
from that has an isolation or sharing defect (E1, E3, E4, E5); a deviation from eager that the method shows
alone too is accuracy (A1). A method is lowered alone only once a program's result differs from eager's, so
a backend that agrees with eager pays nothing.

Alone means alone: each method is lowered, loaded and run in a fresh interpreter of its own, by a new
instance of the backend's class, so nothing the program's run left behind reaches it (not the backend
object, not a module-level or class-level cache, not a runtime's own per-process cache keyed by name, as the
CUDA delegate's is), nor anything another method alone left. The fresh interpreter is a fork of a clean one
that has only imported (pytest_ptn.instruments.clean_interpreter). The method travels there as a file
(``torch.export.save``), its calls and results pickled through the child's socket.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
from torch.export import ExportedProgram

from pytest_ptn.backend import Backend, one_line, resolve_backend
from pytest_ptn.instruments.clean_interpreter import Child, InterpreterGone, clean_interpreter
from pytest_ptn.instruments.comparison import snr_db
from pytest_ptn.instruments.content import digest
from pytest_ptn.instruments.isolation import OUTPUT_TAIL
from pytest_ptn.instruments.process_end import ProcessEnd
from pytest_ptn.programs.source import copied
from pytest_ptn.programs.stateless import Stateless, stateless


@dataclass(frozen=True)
class CallAlone:
    """What the backend computed for one call of the sequence with the method alone."""

    outputs: list[torch.Tensor]
    inputs_after: list[Any]
    """Every user input after the call: the ones the method mutates as it left them."""
    state_after: dict[str, torch.Tensor]
    """Every buffer some method mutates, after the call."""


SUSPECT_DB = 0.0
"""A method alone whose output is at most this SNR from eager (the error as large as the value: no rounding
of a float dtype, nor an int8 recipe, comes near it) while the program's other methods alone are within
``TRUSTED_DB`` is a suspect truth: a wrong tensor, not arithmetic."""
TRUSTED_DB = 20.0
"""How close to eager the other methods alone must be for one method's far result to be suspect: where they
are far too (an upstream kernel bug that every method shows), the backend is simply inaccurate."""


def suspects(
    alone: Sequence[CallAlone], eager: Sequence[tuple[str, Sequence[torch.Tensor]]]
) -> dict[str, str]:
    """Each method whose alone run is far beyond the backend's accuracy on the program's other methods, and
    why: a difference it shares with the program is then never excused as accuracy. ``eager``: each call's
    method and eager outputs."""
    worst: dict[str, float] = {}
    for ran, (method, outputs) in zip(alone, eager, strict=True):
        for have, want in zip(ran.outputs, outputs, strict=False):
            if isinstance(have, torch.Tensor) and have.shape == want.shape and want.is_floating_point():
                worst[method] = min(worst.get(method, float("inf")), snr_db(have, want))
    found = {}
    for method, snr in worst.items():
        others = [s for other, s in worst.items() if other != method]
        if snr <= SUSPECT_DB and others and min(others) >= TRUSTED_DB:
            found[method] = (
                f"alone, {method}() is itself {snr:.1f} dB SNR from eager while the program's other methods "
                f"alone are within {min(others):.1f} dB: the alone run is suspect (state that outlives a "
                "program, such as a cache by name, may reach it)"
            )
    return found


class AloneUnavailable(Exception):
    """A method alone did not lower, load or run on the backend: there is no truth to judge isolation by."""


class MethodsAlone:
    """Each method of one program lowered alone on a new instance of ``backend``'s class, in a fresh process
    of its own, at its first need.

    ``programs`` gives fresh functional programs of every method (a lowering may consume its own);
    ``initial`` each mutated buffer's initial value by key; ``workdir(name)`` a folder to lower in (each
    method lowers into a folder of its own there);
    ``enter(step)`` is told each backend step before it runs (crash isolation)."""

    def __init__(
        self,
        backend: Backend,
        programs: Callable[[], Mapping[str, ExportedProgram]],
        initial: Mapping[str, torch.Tensor],
        workdir: Callable[[str], Path],
        enter: Callable[[str], None] = lambda step: None,
    ):
        self.backend = type(backend)
        self._programs = programs
        self._initial = dict(initial)
        self._workdir = workdir
        self._enter = enter
        self._made: dict[str, tuple[Stateless, Path]] = {}
        self._runs: dict[tuple[object, ...], list[CallAlone] | AloneUnavailable] = {}

    def run(self, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[CallAlone]:
        """What each call gives with its method alone, state threaded from the initial values;
        AloneUnavailable if a method alone does not lower, load or run (the same for every later ask)."""
        key = tuple((method, *map(identity, args)) for method, args in calls)
        if key not in self._runs:
            try:
                self._runs[key] = self._run(calls)
            except AloneUnavailable as e:
                self._runs[key] = e
        found = self._runs[key]
        if isinstance(found, AloneUnavailable):
            raise found
        return found

    def _run(self, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[CallAlone]:
        names = list(dict.fromkeys(method for method, _ in calls))
        made = {method: self._made_stateless(method) for method in names}
        self._enter(f"lowering {', '.join(f'{m}()' for m in names)} alone, each in a fresh process")
        children = {m: AloneProcess(self.backend, m, made[m][1]) for m in names}  # they start together:
        try:  # each lowers while the others do
            for child in children.values():
                child.ready()
            state = {k: t.clone() for k, t in self._initial.items()}
            out = []
            for method, args in calls:
                stateless_method = made[method][0]
                given = [state[k].clone() for k in stateless_method.state_in]
                self._enter(f"running {method}() alone")
                flat = children[method].call([*given, *(copied(a) for a in args)])
                written, inputs_out, outputs = stateless_method.split(flat)
                state.update(zip(stateless_method.state_out, written, strict=True))
                after = list(args)
                for index, value in zip(stateless_method.inputs_out, inputs_out, strict=True):
                    after[index] = value
                out.append(CallAlone(list(outputs), after, {k: t.clone() for k, t in state.items()}))
            return out
        finally:
            for child in children.values():
                child.close()

    def _made_stateless(self, method: str) -> tuple[Stateless, Path]:
        """``method`` made stateless, and the file it is saved in for the child (once per method)."""
        if method not in self._made:
            fresh = self._programs()  # one export serves every method: each lowering gets its own method's
            for name, ep in fresh.items():
                if name in self._made:
                    continue
                made = stateless(ep, self._initial)
                folder = self._workdir(f"alone-{name}") / f"alone-{name}"  # never the program's own
                folder.mkdir(parents=True, exist_ok=True)
                saved = folder / "method.pt2"
                try:
                    torch.export.save(made.program, saved)
                except Exception as e:
                    raise AloneUnavailable(
                        f"method {name!r} alone cannot be handed to a fresh process: {one_line(e)}"
                    ) from e
                self._made[name] = (made, saved)
        return self._made[method]


class AloneProcess:
    """One method alone in a fresh child (forked from this process's clean interpreter), lowering at once."""

    def __init__(self, backend: type[Backend], method: str, saved: Path):
        self.method = method
        self.log = saved.parent / "child.log"
        try:
            self.child: Child | None = clean_interpreter().spawn(f"{__name__}:{_serve.__name__}", self.log)
        except InterpreterGone as e:
            self.child = None
            self._gone = str(e)
            return
        self._send((class_reference(backend), method, str(saved), str(saved.parent)))

    def ready(self) -> None:
        """Wait until the method is lowered and loaded; AloneUnavailable if it was not."""
        self._answer("lowering and loading")

    def call(self, flat: list[Any]) -> list[Any]:
        self._send(flat)
        answer: list[Any] = self._answer("running")
        return answer

    def close(self) -> None:
        if self.child is not None and self.child.returncode is None:
            self._send(None)
            self.child.wait()

    def _send(self, message: Any) -> None:
        assert self.child is not None
        try:
            pickle.dump(message, self.child.requests)
            self.child.requests.flush()
        except OSError:
            pass  # the child is gone: its answer says how

    def _answer(self, step: str) -> Any:
        if self.child is None:
            raise AloneUnavailable(f"method {self.method!r} alone: no fresh process: {self._gone}")
        try:
            outcome, value = pickle.load(self.child.answers)
        except (EOFError, OSError, pickle.UnpicklingError) as e:
            returncode = self.child.wait()
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-OUTPUT_TAIL:])
            said = f"; its last output:\n{tail}" if tail else ""
            raise AloneUnavailable(
                f"method {self.method!r} alone: its process was {ProcessEnd.of(returncode)} while "
                f"{step}{said}"
            ) from e
        if outcome != "ok":
            raise AloneUnavailable(value)
        return value


BackendClass = type[Backend] | str | tuple[Any, str]
"""How a child finds the backend's class: the class, its name, or (the class a variant was made from, the
variant's name)."""


def class_reference(backend: type[Backend]) -> BackendClass:
    """What names ``backend`` in a fresh process: the class itself where pickle finds it by its module and
    name; else, for a class ``Backend.variant`` made, what it was made from; else the name the backend is
    asked for by (an ``ext:`` flow's class is made at run time)."""
    try:
        pickle.dumps(backend)
    except (pickle.PicklingError, AttributeError, TypeError):
        if backend.variant_of is not None:
            base, variant = backend.variant_of
            return (class_reference(base), variant)
        return backend.name
    return backend


def referenced_class(backend: BackendClass) -> type[Backend]:
    """The child's side of ``class_reference``."""
    if isinstance(backend, tuple):
        return referenced_class(backend[0]).variant(backend[1])
    return resolve_backend(backend) if isinstance(backend, str) else backend


def _serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """The child's side: lower and load the method it is given, then run each call it is sent."""
    backend, method, saved, folder = pickle.load(requests)

    def answer(outcome: str, value: Any) -> None:
        pickle.dump((outcome, value), answers)
        answers.flush()

    try:
        cls = referenced_class(backend)
        cls.load_runtime()
        instance = cls()
        program = torch.export.load(saved)
    except Exception as e:
        return answer("unavailable", f"method {method!r} alone: the backend cannot start: {one_line(e)}")
    try:
        lowered = instance.lower({method: program}, Path(folder))
    except Exception as e:
        return answer("unavailable", f"method {method!r} alone does not lower: {one_line(e)}")
    try:
        loaded = instance.load(lowered)
        loaded.load_method(method)
    except Exception as e:
        return answer("unavailable", f"method {method!r} alone does not load: {one_line(e)}")
    answer("ok", None)
    while (flat := pickle.load(requests)) is not None:
        try:
            outputs = [copied(v) for v in loaded.run(method, flat)]  # a runtime reuses its memory
        except Exception as e:
            answer("unavailable", f"method {method!r} alone raised {one_line(e)}")
            continue
        answer("ok", outputs)


def identity(value: Any) -> object:
    """What tells one call's argument from another's, to key what a sequence gives."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, tuple(value.shape), digest(value))
    return repr(value)
