"""The judging of one lowered program, as check_program does it: each copy's calls judged by the pipeline the
scenario tests and the fuzz use (check.wrong_values: the values that differ from eager, the evidence of how
each came about, what the method alone gives), worded as findings; the copies are the first one loaded up
front (its accuracy too), a second one loaded after the first ran, and one loaded at first call; then the
package and storage views the backend's capabilities open. ``pytest_ptn.check`` is the face (check_program);
this is the work behind it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_ptn.backend import Backend, Capability, Loaded, Lowered, one_line
from pytest_ptn.check.findings import Difference, Finding, Stage
from pytest_ptn.mechanisms import Kind, Step, raised
from pytest_ptn.programs.source import UserProgram
from pytest_ptn.reference.planner import StateConflictError
from pytest_ptn.schedule import LoadSchedule

if TYPE_CHECKING:
    import torch

    from pytest_ptn.backend import EagerCall
    from pytest_ptn.check.alone import CallAlone, MethodsAlone
    from pytest_ptn.check.values import Deviation, Mismatch, Ran
    from pytest_ptn.check.wrong_values import Subject, Wrong

ACCURACY = "A1"
"""The rule a deviation from eager that the method shows alone too is reported under."""


def judged(backend: Backend, program: UserProgram, sequence: list, workdir: Path) -> list[Finding]:
    """Every finding of ``program`` on ``backend``: lowered, loaded and run as the module docstring says."""
    from pytest_ptn.check.package import package_findings
    from pytest_ptn.check.storage import concurrent_change, partition, storage_findings, topology

    if program.conflict is not None:
        return rejection(backend, program, program.conflict, workdir)
    try:
        lowered = backend.lower(program.export(), workdir)
    except Exception as e:
        return [Finding("E2", Stage.LOWER, f"lowering failed: {one_line(e)}")]
    try:
        loaded = backend.load(lowered)
    except Exception as e:
        return [Finding("E2", Stage.LOAD, f"loading failed: {one_line(e)}")]
    inspected = program.inspected()
    judge = Judge(backend, program, sequence, workdir, lowered)
    findings = judge.copy(loaded, accuracy=True)
    if any(f.stage == Stage.LOAD for f in findings):
        return findings
    failed = {f.call for f in findings if f.rule != ACCURACY}
    findings += second_copy(judge, load_reversed(backend.load(lowered), program), failed)
    findings += loaded_at_first_call(judge, backend.load(lowered), failed)
    if Capability.PACKAGE in backend.capabilities:
        findings += package_findings(lowered.package(), inspected)
    if Capability.STORAGE in backend.capabilities:
        storages = topology(loaded, inspected)
        findings += storage_findings(storages, inspected)
        if partition(storages) != partition(
            topology(load_reversed(backend.load(lowered), program), inspected)
        ):
            findings.append(
                Finding("S5", Stage.STORAGE, "the sharing topology depends on the order methods load in")
            )
        changed = concurrent_change(backend, lowered, inspected, partition(storages))
        if changed is not None:
            findings.append(Finding("S7", Stage.STORAGE, changed))
    return findings


class Judge:
    """Runs the calls on a loaded copy and words what check.wrong_values finds of them as findings: E1 for
    an output or input, E3 or E4 for a state other methods share or not (a backend with a state view), A1
    for a method that differs from eager alone too; where the backend has a witness
    (pytest_ptn.check.witness), each E1 and A1 finding says whose it is."""

    def __init__(
        self, backend: Backend, program: UserProgram, sequence: list, workdir: Path, lowered: Lowered
    ):
        from pytest_ptn.check.replayed import ProgramReplays
        from pytest_ptn.check.values import Comparison
        from pytest_ptn.check.wrong_values import WrongValues
        from pytest_ptn.programs.exported import constants_of, mutable_keys
        from pytest_ptn.programs.user import eager_calls, widen

        self.backend = backend
        self.lowered = lowered
        self.program = program
        self.workdir = workdir
        self.comparison = Comparison(None, backend.float32_computed_in())
        inspected = program.inspected()
        self.state_rules: dict[str, str] | None = None
        """Each state's rule (E3: methods share it, E4: one method's), where the backend has a state view."""
        if Capability.STATE in backend.capabilities:
            constants = [constants_of(ep) for ep in inspected.values()]
            shared = {k: sum(k in c for c in constants) for k in mutable_keys(inspected)}
            self.state_rules = {k: "E3" if count > 1 else "E4" for k, count in shared.items()}
        self.calls: list[EagerCall] = eager_calls(program, sequence)
        self.unwidened = ""
        """Why eager's float64 rerun of a reduced-precision program raised: compared with the dtype's bound
        alone (stricter), each wrong value says so."""
        if program.reduced_precision:
            try:
                widen(program, sequence, self.calls)
            except Exception as e:
                self.unwidened = f" (bound of the dtype alone: eager's float64 rerun raised {one_line(e)})"
        self.replays = ProgramReplays("program", program.export, lambda: mutable_keys(inspected), {}, None)
        """The faulty-binding replays of the program (check.replayed)."""
        self.wrong = WrongValues(self._subject())
        self._methods_alone: MethodsAlone | None = None

    def copy(
        self,
        loaded: Loaded,
        schedule: LoadSchedule = LoadSchedule.UP_FRONT,
        reversed_first: bool = False,
        accuracy: bool = False,
    ) -> list[Finding]:
        """One copy's findings: its methods loaded as ``schedule`` says, its state view at load (E5) and
        after each call, each call that differs from eager and from its method alone, the call that raised,
        and where ``accuracy``, each method that differs from eager alone too (A1). ``reversed_first``: the
        copy's methods were loaded in reverse order before the calls, as the witness's then are."""
        from pytest_ptn.check.alone import AloneUnavailable

        findings, ran, error = self._run(loaded, schedule)
        if any(f.stage == Stage.LOAD for f in findings):
            return findings
        calls = self.calls[: len(ran)]
        wrong, mismatches = self.wrong.judged(calls, ran, schedule)
        said = sorted(
            [*map(self._unlike, mismatches), *map(self._isolation, wrong)], key=lambda f: f.call or 0
        )
        findings += said
        if error is not None:
            findings.append(self._raised(error, len(ran)))
        if accuracy:  # where no method alone can be had, the isolation findings say so
            with contextlib.suppress(AloneUnavailable):
                findings += map(self._inaccurate, self.wrong.inaccurate(calls, ran))
        return self._witnessed(findings, ran, error, schedule, reversed_first)

    def _run(
        self, loaded: Loaded, schedule: LoadSchedule
    ) -> tuple[list[Finding], list[Ran], Exception | None]:
        """The findings at load (E2 where a method does not load, else E5), what each call gave, and what
        the call after them raised (None: none did)."""
        from pytest_ptn.check.execution import run

        loads = schedule.loads(list(self.program.methods), [c.method for c in self.calls])
        try:
            for method in loads[0]:
                loaded.load_method(method)
        except Exception as e:
            return [Finding("E2", Stage.LOAD, f"loading failed: {one_line(e)}")], [], None
        findings = self._at_load(loaded) if self.state_rules is not None else []
        ran: list[Ran] = []
        try:
            run(loaded, self.calls, [(), *loads[1:]], self.state_rules is not None, ran)
        except Exception as e:
            return findings, ran, e
        return findings, ran, None

    def _at_load(self, loaded: Loaded) -> list[Finding]:
        """E5: each buffer of the state view, as loaded, is eager's exactly (check.initial_state)."""
        from pytest_ptn.check.initial_state import initial_state_wrong

        wrong = initial_state_wrong(loaded.state(), self.program.buffer_fqns(), self.program.state_fqns())
        return [Finding("E5", Stage.COMPARE, line) for line in wrong]

    def _rule(self, buffer: str | None) -> str:
        """The rule a wrong value is under: its state's (E3, E4), or E1 for an output or input."""
        return (self.state_rules or {}).get(buffer, "E1") if buffer is not None else "E1"

    def _isolation(self, w: Wrong) -> Finding:
        d = w.deviation
        detail, difference = self._value(d, d.have)
        buffer = d.where if d.kind == "buffer" else None
        return Finding(
            self._rule(buffer if isinstance(buffer, str) else None),
            Stage.COMPARE,
            detail + "".join(w.notes),
            w.method,
            d.call,
            difference,
            w.label or None,
            w.mechanisms,
        )

    def _inaccurate(self, w: Wrong) -> Finding:
        assert w.truth is not None
        detail, difference = self._value(w.deviation, w.truth)
        detail += "".join(w.notes)
        return Finding(ACCURACY, Stage.COMPARE, detail, w.method, w.deviation.call, difference)

    def _value(self, d: Deviation, value: torch.Tensor) -> tuple[str, Difference | None]:
        """What of the call ``d`` is, and how far ``value`` of it is from eager's."""
        what = {
            "output": f"output {d.where}",
            "input": f"input {d.where} after the call",
            "buffer": f"buffer {d.where!r} after the call",
        }[d.kind]
        if value.shape != d.want.shape:
            return f"{what} has shape {tuple(value.shape)}, eager {tuple(d.want.shape)}", None
        computed_in = self.comparison.computed_in(d.want)
        difference = Difference.between(value, d.want, d.wide, self.comparison.tolerance, computed_in)
        return what + self.unwidened, difference

    def _unlike(self, m: Mismatch) -> Finding:
        """A mismatch no truth excuses (another number of outputs, a buffer the state view lacks)."""
        how = tuple(found for found in m.mechanisms if found.kind is not Kind.UNEXPLAINED)
        return Finding(self._rule(m.buffer), Stage.COMPARE, m.detail, m.method, m.call, mechanisms=how)

    def _raised(self, error: Exception, call: int) -> Finding:
        """The call that raised, with the faulty binding that makes the program raise the same where one
        does (check.explain.explaining_error), else the exception's own mechanism."""
        names = list(self.program.methods)
        said = raised(Step.RUNNING, error, names)
        replay = self.replays.raising(error, self.calls, call, names)
        return Finding(
            "E1",
            Stage.RUN,
            f"the call raised {one_line(error)}",
            self.calls[call].method,
            call,
            explanation=replay.label if replay is not None else None,
            mechanisms=replay.mechanisms if replay is not None else (said,),
        )

    def _witnessed(
        self,
        findings: list[Finding],
        ran: list[Ran],
        error: Exception | None,
        schedule: LoadSchedule,
        reversed_first: bool,
    ) -> list[Finding]:
        """``findings``, each E1 and A1 one of a call saying whose it is (check.witness.testimony), from
        the witness's run of the same calls, its methods loaded as the copy's were."""
        from pytest_ptn.check.execution import run
        from pytest_ptn.check.witness import testimony

        told = [f for f in findings if f.rule in ("E1", ACCURACY) and f.call is not None]
        witness = self.backend.witness(self.lowered) if told else None
        if witness is None:
            return findings
        theirs = load_reversed(witness.loaded, self.program) if reversed_first else witness.loaded
        loads = schedule.loads(list(self.program.methods), [c.method for c in self.calls])
        seen: list[Ran] = []
        stopped: Exception | None = None
        try:
            run(theirs, self.calls, loads, False, seen)
        except Exception as e:
            stopped = e

        def says(call: int) -> str:
            ours = ran[call] if call < len(ran) else error
            their = seen[call] if call < len(seen) else stopped
            assert ours is not None and their is not None
            return testimony(witness, ours, their, self.calls[call], self.comparison)[0]

        return [
            dataclasses.replace(f, whose=says(f.call)) if f in told and f.call is not None else f
            for f in findings
        ]

    def _subject(self) -> Subject:
        """What check.wrong_values reads of this program: no catalogue spec, and the ways to get fresh
        exports, runs, the methods alone and replays only where a wrong value needs them."""
        from pytest_ptn.check.wrong_values import Subject

        return Subject(
            spec=None,
            comparison=self.comparison,
            lowered=self.lowered,
            packaged=Capability.PACKAGE in self.backend.capabilities,
            exports=self.program.export,
            rerun=self._rerun,
            alone=self.alone,
            replays=self.replays.of,
            shown=None,
            read_elsewhere=None,
        )

    def _rerun(self, calls: list[EagerCall], schedule: LoadSchedule, state: bool) -> list[Ran]:
        """A fresh load's run of ``calls``, methods loaded as ``schedule`` says."""
        from pytest_ptn.check.execution import run

        loads = schedule.loads(list(self.program.methods), [c.method for c in calls])
        return run(self.backend.load(self.lowered), calls, loads, state, [])

    def alone(self, calls: list[EagerCall]) -> list[CallAlone]:
        """What each call gives with its method alone, on a new instance of the backend's class in a fresh
        process of its own (pytest_ptn.check.alone); AloneUnavailable where that cannot be had."""
        from pytest_ptn.check.alone import MethodsAlone
        from pytest_ptn.programs.exported import constants_of, functionalize, mutable_keys

        if self._methods_alone is None:
            inspected = self.program.inspected()
            mutable = mutable_keys(inspected)
            initial = {
                k: use.tensor
                for ep in inspected.values()
                for k, use in constants_of(ep).items()
                if k in mutable
            }
            program, workdir = self.program, self.workdir
            self._methods_alone = MethodsAlone(
                self.backend, lambda: functionalize(program.export()), initial, lambda name: workdir
            )
        return self._methods_alone.run([(c.method, c.inputs) for c in calls])


def loaded_at_first_call(judge: Judge, loaded: Loaded, failed: set[int | None]) -> list[Finding]:
    """A copy whose methods load at their first call, after the others ran (as
    ``executorch.extension.module.Module`` loads them): its calls match the methods alone where the up-front
    copy's did. A wrong output that every method loaded up front does not give is loading's: the replays of
    that load schedule may name it (``reinitialised:state``), as they do in the scenario tests and the fuzz
    (check.own_calls.late_only)."""
    schedule = LoadSchedule.AT_FIRST_CALL
    kept = [f for f in judge.copy(loaded, schedule) if f.call not in failed and f.rule != "E5"]
    said = schedule.describe([c.method for c in judge.calls])
    return [dataclasses.replace(f, detail=f"{said}: {f.detail}") for f in kept]


def rejection(
    backend: Backend, program: UserProgram, conflict: StateConflictError, workdir: Path
) -> list[Finding]:
    """A program with a P7 state conflict, as conformance/test_rejection.py checks its P7 scenario: rejected
    at lowering by a backend with a package (P7), every rejection naming the key and both methods (X1)."""
    programs = program.export()
    try:
        backend.lower(programs, workdir)
    except Exception as e:
        missing = [name for name in (*conflict.keys, *conflict.methods) if name not in str(e)]
        if missing:
            detail = f"the rejection {one_line(e)} does not name {missing} ({conflict})"
            return [Finding("X1", Stage.LOWER, detail)]
        return []
    if Capability.PACKAGE in backend.capabilities:
        return [Finding("P7", Stage.LOWER, f"lowering accepted a program the rules reject: {conflict}")]
    return []


def load_reversed(loaded: Loaded, program: UserProgram) -> Loaded:
    """``loaded``, its methods loaded last to first."""
    for name in reversed(program.methods):
        loaded.load_method(name)
    return loaded


def second_copy(judge: Judge, second: Loaded, failed: set[int | None]) -> list[Finding]:
    """A copy loaded after the first one ran, methods in reverse order: it starts from eager's initial state
    (E4: copies share no state), and its calls match the methods alone where the first copy's did (E1)."""
    return [
        dataclasses.replace(f, rule="E4", detail=f"a second loaded copy: {f.detail}")
        if f.rule == "E5"
        else dataclasses.replace(f, detail=f"a second copy, methods loaded in reverse order: {f.detail}")
        for f in judge.copy(second, reversed_first=True)
        if f.call not in failed and f.rule in ("E1", "E5")
    ]
