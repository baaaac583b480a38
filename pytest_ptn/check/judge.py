"""The judging of one lowered program, as check_program does it: each call against eager, a value that
differs set beside the method alone (isolation or arithmetic), faulty-binding explanations, then the copies
(a second one loaded after the first ran, one loaded at first call) and the package and storage views the
backend's capabilities open. ``pytest_ptn.check`` is the face (check_program); this is the work behind it.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_ptn.backend import Backend, Capability, Loaded, Lowered, one_line
from pytest_ptn.check.findings import Difference, Finding, Stage
from pytest_ptn.programs.source import UserProgram
from pytest_ptn.reference.planner import StateConflictError
from pytest_ptn.schedule import LoadSchedule

if TYPE_CHECKING:
    import torch

    from pytest_ptn.check.alone import CallAlone
    from pytest_ptn.check.execution import Compared
    from pytest_ptn.mechanisms import Mechanism

ACCURACY = "A1"
"""The rule a deviation from eager that the method shows alone too is reported under."""


def judged(backend: Backend, program: UserProgram, sequence: list, workdir: Path) -> list[Finding]:
    """Every finding of ``program`` on ``backend``: lowered, loaded and run as the module docstring says."""
    from pytest_ptn.check.explain import explain
    from pytest_ptn.check.package import package_findings
    from pytest_ptn.check.storage import concurrent_partition, partition, storage_findings, topology
    from pytest_ptn.mechanisms import isolation_only
    from pytest_ptn.programs.exported import constants_of, mutable_keys

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
    state_rules = None
    if Capability.STATE in backend.capabilities:
        users = {
            k: [m for m, ep in inspected.items() if k in constants_of(ep)] for k in mutable_keys(inspected)
        }
        state_rules = {k: "E3" if len(methods) > 1 else "E4" for k, methods in users.items()}
    judge = Judge(backend, program, sequence, workdir, lowered)
    findings, returned, differing = judge.run(loaded, state_rules)
    if any(f.stage == Stage.LOAD for f in findings):
        return findings
    findings = explain(findings, returned, program, sequence, eager=judge.eager_outputs)
    findings = in_planned_memory(findings, lowered, sequence)
    if Capability.PACKAGE in backend.capabilities:
        findings = in_package(findings, lowered, program, sequence)
    explained = {f.call for f in findings if any(isolation_only(m) for m in f.mechanisms)}
    findings, accuracy = judge.isolation_and_accuracy(findings, differing, explained)
    findings += accuracy
    failed = {f.call for f in findings if f.rule != ACCURACY}
    second = load_reversed(backend.load(lowered), program)
    copies = second_copy(judge, second, state_rules, failed)
    copies += loaded_at_first_call(judge, backend.load(lowered), state_rules, failed, returned)
    findings += explain(copies, [], program, sequence)  # the calls that raised there
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
        if partition(storages) != concurrent_partition(backend, lowered, inspected):
            findings.append(
                Finding(
                    "S7",
                    Stage.STORAGE,
                    "loading the methods from several threads at once changes the sharing topology",
                )
            )
    return findings


def in_package(
    findings: list[Finding], lowered: Lowered, program: UserProgram, sequence: list
) -> list[Finding]:
    """``findings``, each wrong value nothing else explains saying which tensor of its method the package
    binds, by name, to another method's stored tensor of another dtype or shape (check.package)."""
    from pytest_ptn.check.package import bound_elsewhere

    wrong = [
        (f.call, sequence[f.call][0], lambda key: True) for f in findings if _bare(f) and f.call is not None
    ]
    if not wrong:
        return findings
    stored = bound_elsewhere(lowered.package(), program.export(), wrong)
    return _with(findings, stored)


def _bare(f: Finding) -> bool:
    """A wrong value of the call sequence nothing has explained yet."""
    return f.rule == "E1" and f.stage == Stage.COMPARE and f.call is not None and not f.mechanisms


def _with(findings: list[Finding], found: dict[int, tuple[Mechanism, ...]]) -> list[Finding]:
    """``findings``, each bare one whose call ``found`` has mechanisms for saying them."""
    return [
        dataclasses.replace(
            f, detail=f"{f.detail}; {'; '.join(m.detail for m in found[f.call])}", mechanisms=found[f.call]
        )
        if _bare(f) and f.call in found
        else f
        for f in findings
    ]


def in_planned_memory(findings: list[Finding], lowered: Lowered, sequence: list) -> list[Finding]:
    """``findings``, each wrong value no replay explains saying which state of its method the lowered
    program's own memory plan puts where a method that ran before it keeps tensors (check.memory_plan):
    what that method left there is what the state reads (``shared-arena:state``)."""
    from pytest_ptn.check.memory_plan import planned_together

    wrong = [(f.call, lambda key: True) for f in findings if _bare(f) and f.call is not None]
    if not wrong:
        return findings
    return _with(findings, planned_together(lowered.shared_memory(), [name for name, _ in sequence], wrong))


class Judge:
    """Runs the calls on a loaded copy and tells isolation from arithmetic: a value that differs from eager
    is set beside what the backend computes for the method alone (pytest_ptn.check.alone), lowered at the
    first such value; one the method alone gives too is no isolation finding, and where the method alone
    differs from eager that is an accuracy finding (A1). Where the backend has a witness
    (pytest_ptn.check.witness), each E1 finding says whose it is."""

    def __init__(
        self, backend: Backend, program: UserProgram, sequence: list, workdir: Path, lowered: Lowered
    ):
        import torch

        reduced = backend.float32_computed_in()
        self.backend = backend
        self.lowered = lowered
        self.program = program
        self.sequence = sequence
        self.workdir = workdir
        self.computed_in = getattr(torch, reduced.dtype) if reduced is not None else None
        self.precision = reduced.why if reduced is not None else None
        self._alone: list[CallAlone] | str | None = None
        self._suspects: dict[str, str] | None = None
        self._eager_outputs: list[list[torch.Tensor]] | None = None

    def run(
        self,
        loaded: Loaded,
        state_rules: dict[str, str] | None,
        schedule: LoadSchedule = LoadSchedule.UP_FRONT,
        reversed_first: bool = False,
    ) -> tuple[list[Finding], list[list[Any]], list[Compared]]:
        """One copy's calls: its findings against eager, what each call returned, each differing value.
        ``reversed_first``: the copy's methods were loaded in reverse order before the calls, as the
        witness's then are."""
        from pytest_ptn.check.execution import run_calls
        from pytest_ptn.check.witness import ATTRIBUTED, attributed

        eager, wide = self.program.eager(), self.program.wide_eager()
        findings, returned, differing = run_calls(
            loaded, eager, self.sequence, state_rules, wide, schedule, self.computed_in
        )
        if not any(f.rule == ATTRIBUTED and f.call is not None for f in findings):
            return findings, returned, differing
        witness = self.backend.witness(self.lowered)
        if witness is None:
            return findings, returned, differing
        theirs = load_reversed(witness.loaded, self.program) if reversed_first else witness.loaded
        eager, wide = self.program.eager(), self.program.wide_eager()  # fresh: the calls wrote their state
        their_findings, _, their_differing = run_calls(
            theirs, eager, self.sequence, None, wide, schedule, self.computed_in
        )
        findings, differing = attributed(witness, findings, differing, their_findings, their_differing)
        return findings, returned, differing

    def isolation_and_accuracy(
        self, findings: list[Finding], differing: list[Compared], explained: set[int | None] | None = None
    ) -> tuple[list[Finding], list[Finding]]:
        """(the isolation findings, the accuracy findings) of one copy's run. A call whose wrong output one
        faulty binding explains (``explained``: another method's tensor, a private copy of state) is an
        isolation finding whatever the method alone gives: a cache that outlives a program (the CUDA
        delegate's is process-wide, by name) hands the method alone the same wrong tensor."""
        import torch

        from pytest_ptn.instruments.comparison import equal

        if not differing:
            return findings, []
        alone = self.alone()
        if isinstance(alone, str):
            noted = {id(c.finding) for c in differing}
            judged = [
                dataclasses.replace(f, detail=f"{f.detail} (judged against eager: {alone})")
                if id(f) in noted
                else f
                for f in findings
            ]
            return judged, []
        suspect = self.suspects(alone)
        arithmetic: set[int] = set()
        suspected: dict[int, str] = {}
        accuracy = []
        for c in differing:
            call = c.finding.call
            if call in (explained or set()):
                continue
            truth = c.of(alone[call]) if call is not None and call < len(alone) else None
            if not isinstance(truth, torch.Tensor):
                continue
            computed_in = self.computed_in if c.want.dtype == torch.float32 else None
            if equal(c.have, truth, c.wide, None, computed_in, eager=c.want):
                why = suspect.get(c.finding.method or "")
                if why is None:
                    arithmetic.add(id(c.finding))
                else:  # never excused: an isolation finding that says why, and an accuracy one too
                    suspected[id(c.finding)] = why
                difference = Difference.between(truth, c.want, c.wide, computed_in=computed_in)
                if difference is not None:
                    said = f" ({self.precision})" if computed_in is not None else ""
                    said += f"; {why}" if why is not None else ""
                    accuracy.append(
                        Finding(
                            ACCURACY,
                            Stage.COMPARE,
                            c.finding.detail + said,
                            c.finding.method,
                            call,
                            difference,
                            whose=c.finding.whose,
                        )
                    )
        kept = [
            dataclasses.replace(f, detail=f"{f.detail}; {suspected[id(f)]}") if id(f) in suspected else f
            for f in findings
            if id(f) not in arithmetic
        ]
        return kept, accuracy

    def suspects(self, alone: list[CallAlone]) -> dict[str, str]:
        """The methods whose alone run is suspect (pytest_ptn.check.alone.suspects): asked by every copy's
        run, computed once, as the alone run is."""
        from pytest_ptn.check.alone import suspects

        if self._suspects is None:
            eager = self.eager_outputs()
            named = [(name, out) for (name, _), out in zip(self.sequence, eager, strict=True)]
            self._suspects = suspects(alone, named)
        return self._suspects

    def eager_outputs(self) -> list[list[torch.Tensor]]:
        """What eager gives on each call of the sequence, its outputs flat: computed once."""
        from pytest_ptn.check.execution import flat

        if self._eager_outputs is None:
            modules = self.program.eager()
            self._eager_outputs = [flat(modules[name](*copy.deepcopy(args))) for name, args in self.sequence]
        return self._eager_outputs

    def isolation(self, findings: list[Finding], differing: list[Compared]) -> list[Finding]:
        """The isolation findings of another copy's run (its accuracy is the first copy's)."""
        return self.isolation_and_accuracy(findings, differing)[0]

    def alone(self) -> list[CallAlone] | str:
        """What each call gives with its method alone, on a new instance of the backend's class in a fresh
        process of its own (pytest_ptn.check.alone), or why that cannot be had."""
        from pytest_ptn.check.alone import AloneUnavailable, MethodsAlone
        from pytest_ptn.programs.exported import constants_of, functionalize, mutable_keys

        if self._alone is None:
            inspected = self.program.inspected()
            mutable = mutable_keys(inspected)
            initial = {
                k: use.tensor
                for ep in inspected.values()
                for k, use in constants_of(ep).items()
                if k in mutable
            }

            program, workdir = self.program, self.workdir
            methods = MethodsAlone(
                self.backend, lambda: functionalize(program.export()), initial, lambda name: workdir
            )
            try:
                self._alone = methods.run(self.sequence)
            except AloneUnavailable as e:
                self._alone = f"no truth of the method alone: {e}"
        return self._alone


def loaded_at_first_call(
    judge: Judge,
    loaded: Loaded,
    state_rules: dict[str, str] | None,
    failed: set[int | None],
    up_front: list[list[Any]],
) -> list[Finding]:
    """A copy whose methods load at their first call, after the others ran (as
    ``executorch.extension.module.Module`` loads them): its calls match the methods alone where the up-front
    copy's did. A wrong output that the up-front copy (``up_front``: what each of its calls returned) did
    not give is loading's: the replays of that load schedule may name it (``reinitialised:state``), as they
    do in the scenario tests and the fuzz (check.own_calls.late_only)."""
    from pytest_ptn.check.explain import explain
    from pytest_ptn.check.values import differing_calls

    schedule = LoadSchedule.AT_FIRST_CALL
    findings, returned, differing = judge.run(loaded, state_rules, schedule)
    kept = [f for f in judge.isolation(findings, differing) if f.call not in failed and f.rule != "E5"]
    late = differing_calls(returned, up_front)
    kept = explain(kept, returned, judge.program, judge.sequence, schedule, late, judge.eager_outputs)
    said = schedule.describe([name for name, _ in judge.sequence])
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


def second_copy(
    judge: Judge, second: Loaded, state_rules: dict[str, str] | None, failed: set[int | None]
) -> list[Finding]:
    """A copy loaded after the first one ran, methods in reverse order: it starts from eager's initial state
    (E4: copies share no state), and its calls match the methods alone where the first copy's did (E1)."""
    findings, _, differing = judge.run(second, state_rules, reversed_first=True)
    return [
        dataclasses.replace(f, rule="E4", detail=f"a second loaded copy: {f.detail}")
        if f.rule == "E5"
        else dataclasses.replace(f, detail=f"a second copy, methods loaded in reverse order: {f.detail}")
        for f in judge.isolation(findings, differing)
        if f.call not in failed and f.rule in ("E1", "E5")
    ]
