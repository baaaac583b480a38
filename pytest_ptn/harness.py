"""One conformance case: a backend and a scenario, with lowering cached for the session and eager truth.

Lowering is the slow step, so every test of one (backend, scenario) shares one lowering (or its rejection);
loading is cheap and every test gets fresh loaded copies, so state never leaks between tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pytest_ptn.mechanisms import Kind, Mechanism, Role, Step, isolation_only, raised
from pytest_ptn.run.state import LoweringCache
from pytest_ptn.schedule import LoadSchedule

if TYPE_CHECKING:
    import torch

    from pytest_ptn.backend import Backend, EagerCall, Loaded, Lowered, Whose
    from pytest_ptn.check.alone import CallAlone, MethodsAlone
    from pytest_ptn.check.earlier import EarlierPrograms
    from pytest_ptn.check.explain import Replay, Replays
    from pytest_ptn.instruments.comparison import Tolerance
    from pytest_ptn.programs.user import UserScenario
    from pytest_ptn.spec import ProgramSpec, Scenario


class ProgramUnderTest(Protocol):
    """What the conformance tests read from a case's program: a catalogue one (programs.build.Program) or a
    backend repository's own (programs.user.NamedProgram)."""

    @property
    def method_names(self) -> tuple[str, ...]: ...

    def export(self) -> dict[str, torch.export.ExportedProgram]:
        """Fresh programs, one per method: a lowering may consume the ones it is given."""

    def eager(self) -> list[EagerCall]:
        """The call sequence as eager PyTorch ran it."""

    def run_eager(self, sequence: tuple[str, ...]) -> list[EagerCall]: ...

    def state_fqns(self) -> dict[str, torch.Tensor]:
        """Initial value of every buffer some method writes, by FQN."""

    def buffer_fqns(self) -> dict[str, torch.Tensor]:
        """Initial value of every buffer, written or only read, by FQN."""

    def with_other_values(self) -> ProgramUnderTest:
        """The same names, shapes and calls holding other tensors (S4's second program)."""


@dataclass
class Mismatch:
    """One call whose result differs from the truth; ``str()`` is the line a failure shows."""

    call: int
    """Index in the call sequence."""
    method: str
    """The method called."""
    detail: str
    """What differs, in words, with the numbers."""
    mechanisms: tuple[Mechanism, ...] = ()
    """How the wrong value came about (pytest_ptn.mechanisms), as the checks found it; none found, it is
    unexplained at its call (the causes group tests by where nothing explains a value)."""

    def __post_init__(self) -> None:
        if not self.mechanisms:
            self.mechanisms = (Mechanism(Kind.UNEXPLAINED, "", f"call #{self.call} {self.method}()"),)

    def __str__(self) -> str:
        return f"call #{self.call} {self.method}(): {self.detail}"


class Case:
    def __init__(
        self,
        backend: Backend,
        scenario: Scenario | UserScenario,
        workdir: Callable[[str], Path],
        cache: LoweringCache | None = None,
        earlier: EarlierPrograms | None = None,
    ):
        """``cache`` is shared by the cases of one run (RunState.lowerings); by default a case has its own.
        ``earlier``: what the programs this backend loaded before held, whose tensors a cache that outlives
        its program hands this one (the fuzz's record; its replays join this case's)."""
        self.backend = backend
        self.earlier = earlier
        self.scenario = scenario
        self._workdir = workdir
        self._cache = cache if cache is not None else LoweringCache()
        self.found: list[Mechanism] = []
        """How what this case's checks found wrong came about (pytest_ptn.mechanisms), in the order found:
        the test that fails on them carries them to the reports (mechanisms.PROPERTY)."""
        self.raised_at: int | None = None
        """The call of the sequence the backend raised at, after ``run_calls`` raised."""
        self._earlier_replays: dict[tuple[object, ...], Replays] = {}
        self.whose: set[Whose] = set()
        """Whose what this case's checks found is, where the backend has a witness (``attributed``): the
        test that fails on it carries it to the reports (backend.WHOSE_PROPERTY)."""

    @cached_property
    def program(self) -> ProgramUnderTest:
        """The program as the backend lowers it, and its truth: a backend that quantizes gets each method
        quantized by its recipe, checked against the converted modules (pytest_ptn.programs.quantized)."""
        from pytest_ptn.programs.build import Program
        from pytest_ptn.programs.quantized import QuantizedProgram
        from pytest_ptn.programs.user import UserScenario

        if isinstance(self.scenario, UserScenario):
            return self.scenario.program
        if self.quantized:
            return QuantizedProgram(Program(self.scenario.spec), self.backend.quantize)
        return Program(self.scenario.spec)

    @property
    def quantized(self) -> bool:
        from pytest_ptn.backend import Capability

        return Capability.QUANTIZE in self.backend.capabilities

    @property
    def tolerance(self) -> Tolerance | None:
        """What the backend declares its quantized results may differ by (None: the dtype's bound alone)."""
        return self.backend.tolerance if self.quantized else None

    def exported(self) -> dict[str, torch.export.ExportedProgram]:
        """Fresh programs to inspect (never the ones the backend lowered), functionalized so that their
        signatures list every buffer a method mutates. Computed once per scenario: treat them as read-only."""
        from pytest_ptn.programs.exported import functionalize

        inspected = self._cache.inspected
        name = self.scenario.name
        if name not in inspected:
            inspected[name] = functionalize(self.program.export())
        return inspected[name]

    def _enter(self, step: str) -> None:
        """Note a backend step for crash isolation; fail at once if it crashed a worker earlier."""
        from pytest_ptn.programs.catalogue import BY_NAME
        from pytest_ptn.scheduling import crashes

        named = self.catalogue_spec is None or self.scenario.name in BY_NAME  # names tell programs apart
        try:
            crashes.enter(self.backend.name, self.scenario.name, step, named)
            return
        except crashes.CrashedEarlier as e:
            earlier = str(e)
            self.found.append(e.mechanism)
        import pytest

        pytest.fail(earlier, pytrace=False)

    def lower_fresh(self) -> Lowered:
        programs = self.program.export()
        self._enter("lowering")
        return self.backend.lower(programs, self._workdir(self.scenario.name))

    def lower(self) -> Lowered:
        """The session's lowering of this case; a rejection is re-raised for every test that asks."""
        result = self.lowered()
        if isinstance(result, Exception):
            if self.scenario.valid:  # quote the upstream message, not its traceback
                import pytest

                self.found.append(raised(Step.LOWERING, result))
                pytest.fail(f"lowering failed: {type(result).__name__}: {result}", pytrace=False)
            raise result
        return result

    def lowered(self) -> Lowered | Exception:
        """The session's lowering of this case, lowered now if no test did yet, or the exception that
        rejected it (kept: the rejection is the result)."""
        lowered = self._cache.lowered
        key = (id(self.backend), self.scenario.name)
        if key not in lowered:
            try:
                lowered[key] = self.lower_fresh()
            except Exception as e:
                lowered[key] = e
        return lowered[key]

    def replaying(self, lowered: Lowered) -> None:
        """Make ``lowered`` (a repro bundle's artifact) the case's lowering: what its tests load, and its
        witness too, is that file, not a new lowering."""
        self._cache.lowered[(id(self.backend), self.scenario.name)] = lowered

    def lowering(self) -> Lowered | Exception | None:
        """What the session's lowering of this case gave, without lowering (None if no test lowered it yet):
        a repro bundle copies the artifact the failing test loaded."""
        return self._cache.lowered.get((id(self.backend), self.scenario.name))

    @cached_property
    def loader(self) -> Backend:
        """The backend instance this test loads through: one of its own, so that what a loader keeps as long
        as its backend object lives (a by-name constant cache, as the ExecuTorch CUDA delegate keeps one for
        its process) carries no other test's programs into this one's verdict, whatever ran before it on the
        worker. A test that loads two programs (S4) loads both through it."""
        return type(self.backend)()

    def load(self) -> Loaded:
        lowered = self.lower()
        self._enter("loading")
        return self.loader.load(lowered)

    def eager(self) -> list[EagerCall]:
        return self.program.eager()

    @property
    def catalogue_spec(self) -> ProgramSpec | None:
        """The spec the case's program is built from; None for a user program, which has no metadata."""
        from pytest_ptn.programs.user import UserScenario

        return None if isinstance(self.scenario, UserScenario) else self.scenario.spec

    def read_names(self, method: str) -> list[str]:
        """What each output value of ``method`` reads; nothing for a user program (a failure shows values)."""
        if self.catalogue_spec is None or self.catalogue_spec.vectors:  # a vector's values read several
            return []
        m = self.catalogue_spec.method(method)
        return [*m.reads, *(["cond"] if m.branch else [])] or ["x.sum()"]

    def _owners(self, method: str, inputs: tuple[torch.Tensor, ...]) -> dict[str, list[tuple[str, float]]]:
        """For each name ``method`` reads: what the value would be with another method's tensor of that name
        (so a failure can say whose weights a method read); known for catalogue programs only."""
        import torch

        from pytest_ptn.programs.build import make_tensor, weighted_sum

        if self.catalogue_spec is None or self.catalogue_spec.vectors:
            return {}
        dtype = getattr(torch, self.catalogue_spec.dtype)
        xs = float(inputs[0].sum())
        out: dict[str, list[tuple[str, float]]] = {}
        for other in self.catalogue_spec.methods:
            for c in other.constants:
                if other.name != method and c.family not in ("literal", "scalar"):
                    value = float(weighted_sum(make_tensor(c), dtype)) + xs
                    out.setdefault(c.name, []).append((other.name, value))
        return out

    def alone(self) -> MethodsAlone:
        """Each method of this case lowered alone by a new instance of its backend's class in a fresh process
        of its own, state explicit (pytest_ptn.check.alone): the truth isolation is judged against; shared
        by the case's tests, lowered at first need."""
        from pytest_ptn.check.alone import MethodsAlone
        from pytest_ptn.programs.exported import functionalize

        key = (id(self.backend), self.scenario.name)
        if key not in self._cache.alone:
            name = self.scenario.name
            self._cache.alone[key] = MethodsAlone(
                self.backend,
                lambda: functionalize(self.program.export()),
                self.program.state_fqns(),
                lambda what: self._workdir(f"{name}-{what}"),
                self._enter,
            )
        return self._cache.alone[key]

    def run_calls(
        self,
        loaded: Loaded,
        calls: list[EagerCall],
        schedule: LoadSchedule = LoadSchedule.AT_FIRST_CALL,
        state: bool = False,
    ) -> list[Ran]:
        """What ``loaded`` gives for each call, methods loaded as ``schedule`` says (and its state view after
        each call, where ``state``)."""
        loads = schedule.loads(self.program.method_names, [c.method for c in calls])
        ran = []
        for i, (call, to_load) in enumerate(zip(calls, loads, strict=True)):
            self.raised_at = i  # until it runs: where an error of the backend's raised
            for method in to_load:
                self._enter(f"loading {method}()")
                loaded.load_method(method)
            given = [t.clone() for t in call.inputs]
            self._enter(f"running {call.method}()")
            outputs = [t.clone() for t in loaded.run(call.method, given)]  # a runtime may reuse its memory
            shown = {k: t.clone() for k, t in loaded.state().items()} if state else None
            ran.append(Ran(outputs, given, shown))
        self.raised_at = None
        return ran

    def run_sequence(
        self,
        loaded: Loaded,
        calls: list[EagerCall] | None = None,
        schedule: LoadSchedule = LoadSchedule.AT_FIRST_CALL,
        state: bool = False,
    ) -> list[Mismatch]:
        """Run the call sequence on ``loaded``, methods loaded as ``schedule`` says: every way it differs from
        what the backend computes for each method alone (E1, E3, E4, E5), where it differs from eager."""
        calls = calls if calls is not None else self.eager()
        ran = self.run_calls(loaded, calls, schedule, state)
        found = self.mismatches(calls, ran, schedule)
        return self.attributed(found, calls, ran, schedule) if found else found

    def attributed(
        self, found: list[Mismatch], calls: list[EagerCall], ran: list[Ran], schedule: LoadSchedule
    ) -> list[Mismatch]:
        """``found``, each saying whose it is where the backend has a witness (``Backend.witness``: for a
        runtime of .pte files, executorch.runtime on the same .pte), run through the same calls and schedule:
        the same values are the lowering's (or upstream's), eager's values the runtime's own."""
        import dataclasses

        from pytest_ptn.backend import one_line
        from pytest_ptn.instruments.comparison import equal

        lowered = self.lowered()
        witness = None if isinstance(lowered, Exception) else self.backend.witness(lowered)
        if witness is None:
            return found
        try:
            seen = self.run_calls(witness.loaded, calls, schedule)
        except Exception as e:
            said = f"{witness.by} raised {one_line(e)}"
            return [dataclasses.replace(m, detail=f"{m.detail}; {said}") for m in found]
        out = []
        for m in found:
            theirs, ours, call = seen[m.call].outputs, ran[m.call].outputs, calls[m.call]
            same = _same_outputs(ours, theirs)
            bounds = call.output_bounds()
            eager = len(theirs) == len(call.outputs) and all(
                equal(t, e, b, self.tolerance, self._computed_in(e))
                for t, e, b in zip(theirs, call.outputs, bounds, strict=True)
            )
            out.append(dataclasses.replace(m, detail=f"{m.detail}; {witness.says(same, eager)}"))
            if (whose := witness.whose(same, eager)) is not None:
                self.whose.add(whose)
        return out

    def mismatches(
        self, calls: list[EagerCall], ran: list[Ran], schedule: LoadSchedule = LoadSchedule.UP_FRONT
    ) -> list[Mismatch]:
        """Each output, mutated input and (where ``ran`` has it) buffer that differs from eager
        (pytest_ptn.instruments.comparison) and from what the method alone gives on this backend: an
        isolation defect. A difference the method alone shows too is its arithmetic, accuracy's business
        (``accuracy``), unless the method alone is itself far beyond the backend's accuracy on the other
        methods (check.alone.suspects): then it stays an isolation defect, saying so. Where no method alone
        can be had, the difference is reported against eager, saying so."""
        from pytest_ptn.check.alone import suspects

        deviations, mismatches = self._deviations(calls, ran)
        if not deviations:
            self.found += [m for mismatch in mismatches for m in mismatch.mechanisms]
            return mismatches
        details, explained = self._explained(deviations, calls, ran, schedule)
        forced = {call for call, how in explained.items() if any(isolation_only(m) for m in how)}
        planned = self._planned_together(calls, [d for d in deviations if d.call not in explained])
        apart = self._other_than_on_its_own(calls, [d for d in deviations if d.call in planned])
        forced |= apart.keys()
        accounted = explained.keys() | planned.keys()
        stored = self._stored_otherwise(calls, [d for d in deviations if d.call not in accounted])
        forced |= stored.keys()
        unexplained = [d for d in deviations if d.call not in forced]
        alone, unavailable = self._alone(calls) if unexplained else (None, None)
        suspect = suspects(alone, [(c.method, c.outputs) for c in calls]) if alone is not None else {}
        for d, detail in zip(deviations, details, strict=True):
            truth = d.of(alone[d.call]) if alone is not None else None
            method = calls[d.call].method
            if d.call not in forced and truth is not None and self._same(d, truth):
                if method not in suspect:
                    continue  # the method alone computes it so: accuracy, not isolation
                detail += f"; {suspect[method]}"
            elif truth is not None and not self._same_as_eager(d, truth):
                detail += f"; alone, the method gives {_fmt(truth)}"
            if unavailable is not None and d.call not in forced:
                detail += f" (judged against eager: {unavailable})"
            how = explained.get(d.call) or planned.get(d.call) or stored.get(d.call) or ()
            if d.call not in explained and (evidence := planned.get(d.call) or stored.get(d.call)):
                detail += f"; {'; '.join(m.detail for m in evidence)}"
            if d.call not in explained and d.call in apart and (own := d.of(apart[d.call])) is not None:
                detail += f"; with no other method's calls, this program's {d.what} is {_fmt(own)}"
            mismatches.append(Mismatch(d.call, calls[d.call].method, detail, how))
        self.found += [m for mismatch in mismatches for m in mismatch.mechanisms]
        return sorted(mismatches, key=lambda m: m.call)

    def _other_than_on_its_own(
        self, calls: list[EagerCall], deviations: list[Deviation]
    ) -> dict[int, CallAlone]:
        """The calls of ``deviations`` (the memory plan's suspects) whose every wrong value this same lowered
        program gives otherwise when only that method's calls run (no other method loaded), where the method
        reads no state another method writes (so eager's value owes them nothing): the other methods made
        the value what it is, an isolation defect whatever the method lowered alone gives, which then need
        not be lowered (seconds a program). What the method's own calls gave, by call."""
        from pytest_ptn.check.alone import CallAlone

        calls_of = {d.call for d in deviations}
        if not calls_of:
            return {}
        exports = self.program.export()
        written = {m: set(ep.graph_signature.buffers_to_mutate.values()) for m, ep in exports.items()}
        out: dict[int, CallAlone] = {}
        for call in sorted(calls_of):
            method = calls[call].method
            reads = set(exports[method].graph_signature.inputs_to_buffers.values())
            if any(reads & keys for other, keys in written.items() if other != method):
                continue
            own = [c for c in calls[: call + 1] if c.method == method]
            wrong = [d for d in deviations if d.call == call]
            try:
                last = self.run_calls(self.load(), own, state=any(d.kind == "buffer" for d in wrong))[-1]
            except Exception:  # the method does not run on its own here: no evidence either way
                continue
            seen = CallAlone(last.outputs, last.inputs_after, last.state or {})
            if all((value := d.of(seen)) is not None and not self._same(d, value) for d in wrong):
                out[call] = seen
        return out

    def _stored_otherwise(
        self, calls: list[EagerCall], deviations: list[Deviation]
    ) -> dict[int, tuple[Mechanism, ...]]:
        """For each call of ``deviations`` nothing else explains: the tensors of its method the lowered
        package binds by name to another method's stored tensor of another dtype or shape
        (check.package.bound_elsewhere)."""
        from pytest_ptn.backend import Capability
        from pytest_ptn.check.package import bound_elsewhere

        lowered = self.lowered()
        if (
            not deviations
            or Capability.PACKAGE not in self.backend.capabilities
            or isinstance(lowered, Exception)
        ):
            return {}
        wrong = [(d.call, calls[d.call].method, self._may_read(calls[d.call].method, d)) for d in deviations]
        return bound_elsewhere(lowered.package(), self.program.export(), wrong)

    def _planned_together(
        self, calls: list[EagerCall], deviations: list[Deviation]
    ) -> dict[int, tuple[Mechanism, ...]]:
        """For each call of ``deviations`` no replay explains: the state of its method whose planned memory
        the tensors of a method that ran before it also use, as the lowered program's own memory plan says
        (``Lowered.shared_memory``): what that method left there is what the state reads."""
        from pytest_ptn.check.memory_plan import planned_together

        lowered = self.lowered()
        if not deviations or isinstance(lowered, Exception):
            return {}
        methods = [c.method for c in calls]
        wrong = [(d.call, self._may_read(methods[d.call], d)) for d in deviations]
        return planned_together(lowered.shared_memory(), methods, wrong)

    def _explained(
        self, deviations: list[Deviation], calls: list[EagerCall], ran: list[Ran], schedule: LoadSchedule
    ) -> tuple[list[str], dict[int, tuple[Mechanism, ...]]]:
        """Each deviation's detail, and the calls whose wrong values a faulty binding accounts for: another
        method's same-named tensor, a private copy of shared state, two buffers in one memory
        (pytest_ptn.check.explain). Such a call is an isolation defect whatever the method alone gives (a
        cache that outlives a program, as the CUDA delegate's is, hands the method alone the same tensor),
        and it needs no method lowered alone."""
        details: list[str] = []
        explained: dict[int, tuple[Mechanism, ...]] = {}
        for d in deviations:
            detail, read = self._detail(d, calls)
            details.append(detail)
            if read:
                method = calls[d.call].method
                how = Mechanism(Kind.BY_NAME, self._role_of_read(method), f"method {method!r} read {read}")
                explained[d.call] = (how,)
        wrong = {d.call: calls[d.call].method for d in deviations if d.kind == "output"}
        wrong = {call: method for call, method in wrong.items() if call not in explained}
        from pytest_ptn.check.explain import label_of, mechanisms_of

        replays = self._bindings(calls, ran, wrong, schedule) if wrong else {}
        for i, d in enumerate(deviations):
            if d.kind == "output" and d.call in replays:
                details[i] += f"; it equals {label_of(replays[d.call])}"
        return details, explained | {call: mechanisms_of(found) for call, found in replays.items()}

    def _may_read(self, method: str, d: Deviation) -> Callable[[str], bool]:
        """Whether deviation ``d`` of ``method`` can be a value of tensor ``key``: the buffer itself, or an
        output of a method the catalogue spec says reads it (any value of a user program's method)."""
        spec = self.catalogue_spec
        if d.kind == "buffer":
            return lambda key: key == d.where
        if spec is None:
            return lambda key: True
        reads = set(spec.method(method).reads)
        return lambda key: key.rsplit(".", 1)[-1] in reads or key in reads

    def _role_of_read(self, method: str) -> Role:
        """What sort of tensor a catalogue method's by-name read was of: a buffer if it reads one, else a
        constant (its values name what they read; a by-name read is never of state, which is shared)."""
        spec = self.catalogue_spec
        if spec is not None and any(c.family == "buffer" for c in spec.method(method).constants):
            return Role.BUFFER
        return Role.CONSTANT

    def _bindings(
        self, calls: list[EagerCall], ran: list[Ran], wrong: dict[int, str], schedule: LoadSchedule
    ) -> dict[int, tuple[Replay, ...]]:
        """What faulty bindings give for each call of ``wrong`` they account for (check.explain)."""
        from pytest_ptn.check.explain import explanations

        replays = self.replays(calls, earlier=False)
        late = (
            self._late_only(calls, ran, wrong)
            if schedule is LoadSchedule.AT_FIRST_CALL and any(r.schedule for r in replays)
            else set()
        )
        eager = [c.outputs for c in calls]
        shown = self.earlier.shown if self.earlier is not None else None
        found = explanations(replays, [r.outputs for r in ran], wrong, schedule, late, eager, shown)
        if self.earlier is None or all(any(not r.weak for r in found.get(call, ())) for call in wrong):
            return found
        # something the program alone does not account for, or only by metadata: what earlier programs held
        # (exported only now, for the few programs that need it)
        replays = self.replays(calls)
        return explanations(replays, [r.outputs for r in ran], wrong, schedule, late, eager, shown)

    def _late_only(self, calls: list[EagerCall], ran: list[Ran], wrong: dict[int, str]) -> set[int]:
        """The calls of ``wrong`` (run with each method loaded at its first call) whose values a fresh load
        of every method up front does not give: what loading a method late did, a fault of loading."""
        try:
            up_front = self.run_calls(self.load(), calls, LoadSchedule.UP_FRONT)
        except Exception:  # no evidence either way
            return set()
        return {call for call in wrong if not _same_outputs(ran[call].outputs, up_front[call].outputs)}

    def replays(self, calls: list[EagerCall] | None = None, earlier: bool = True) -> Replays:
        """The faulty-binding replays of ``calls`` (by default the case's sequence), made once for every test
        of the case that runs them (check.explain.faulty_replays), and, unless ``earlier`` is False, those
        bound to what earlier programs held (``self.earlier``); none for a quantized program, whose own
        ``_read_elsewhere`` says whose constant it read."""
        from pytest_ptn.check.alone import identity
        from pytest_ptn.check.explain import faulty_replays
        from pytest_ptn.programs.quantized import QuantizedProgram

        if isinstance(self.program, QuantizedProgram):
            return []
        sequence = [(c.method, c.inputs) for c in (calls if calls is not None else self.eager())]
        key = (self.scenario.name, *((m, *map(identity, args)) for m, args in sequence))
        replays = self._cache.replays
        if key not in replays:
            replays[key] = faulty_replays(self.program.export(), set(self.program.state_fqns()), sequence)
        if self.earlier is None or not earlier:
            return replays[key]
        if key not in self._earlier_replays:
            mutable = set(self.program.state_fqns())
            self._earlier_replays[key] = self.earlier.replays(self.program.export(), mutable, sequence)
        return replays[key] + self._earlier_replays[key]

    def accuracy(self) -> list[Mismatch]:
        """A1: where the program's results differ from eager's, how each method alone differs from eager
        (max abs, max rel, SNR, and the precision the backend declares it computes float32 in). Not
        applicable where the program does not lower, or a method alone does not: nothing to judge by. Where
        the backend has a witness, each says whose it is, as E1's do (``attributed``)."""
        import pytest
        import torch

        from pytest_ptn.check.alone import AloneUnavailable, suspects
        from pytest_ptn.check.findings import Difference
        from pytest_ptn.ruleset import not_applicable

        lowered = self.lowered()
        if isinstance(lowered, Exception):  # E2's finding
            pytest.skip(not_applicable(f"the program does not lower: {type(lowered).__name__}"))
        calls = self.eager()
        try:
            ran = self.run_calls(self.load(), calls, LoadSchedule.UP_FRONT)
        except Exception as e:  # E2's or E1's finding: the program does not load or run
            pytest.skip(not_applicable(f"the program does not run: {type(e).__name__}: {e}"))
        deviations, _ = self._deviations(calls, ran)
        if deviations:  # a value a faulty binding explains is isolation's, whatever the method alone gives
            _, explained = self._explained(deviations, calls, ran, LoadSchedule.UP_FRONT)
            forced = {call for call, how in explained.items() if any(isolation_only(m) for m in how)}
            deviations = [d for d in deviations if d.call not in forced]
        if not deviations:
            return []
        try:
            alone = self.alone().run([(c.method, c.inputs) for c in calls])
        except AloneUnavailable as e:
            pytest.skip(not_applicable(f"no truth of the methods alone: {e}"))
        reduced = self.backend.float32_computed_in()
        suspect = suspects(alone, [(c.method, c.outputs) for c in calls])
        mismatches = []
        for d in deviations:
            truth = d.of(alone[d.call])
            if truth is None or self._same_as_eager(d, truth):
                continue  # alone, the method agrees with eager: the program's difference is isolation's
            if truth.shape != d.want.shape:
                detail = f"{d.what} has shape {tuple(truth.shape)}, eager {tuple(d.want.shape)}"
            else:
                computed_in = self._computed_in(d.want)
                difference = Difference.between(truth, d.want, d.wide, self.tolerance, computed_in)
                detail = f"{d.what}: {difference}"
            if reduced is not None and d.want.dtype == torch.float32:
                detail += f"; {reduced.why}"
            if calls[d.call].method in suspect:
                detail += f"; {suspect[calls[d.call].method]}"
            mismatches.append(Mismatch(d.call, calls[d.call].method, detail))
        return self.attributed(mismatches, calls, ran, LoadSchedule.UP_FRONT) if mismatches else mismatches

    def _alone(self, calls: list[EagerCall]) -> tuple[list[CallAlone] | None, str | None]:
        from pytest_ptn.check.alone import AloneUnavailable

        try:
            return self.alone().run([(c.method, c.inputs) for c in calls]), None
        except AloneUnavailable as e:
            return None, f"no truth of the method alone: {e}"

    def _computed_in(self, want: torch.Tensor) -> torch.dtype | None:
        """The coarser dtype the backend declares it computes ``want``'s float32 values in, or None."""
        import torch

        reduced = self.backend.float32_computed_in()
        return getattr(torch, reduced.dtype) if reduced is not None and want.dtype == torch.float32 else None

    def _same(self, d: Deviation, truth: torch.Tensor) -> bool:
        """The program's value equals what the method alone gives (the same bound, eager's noise kept)."""
        from pytest_ptn.instruments.comparison import equal

        return equal(d.have, truth, d.wide, None, self._computed_in(d.want), eager=d.want)

    def _same_as_eager(self, d: Deviation, value: torch.Tensor) -> bool:
        from pytest_ptn.instruments.comparison import equal

        return equal(value, d.want, d.wide, self.tolerance, self._computed_in(d.want))

    def _deviations(self, calls: list[EagerCall], ran: list[Ran]) -> tuple[list[Deviation], list[Mismatch]]:
        """Every value that differs from eager's, and the mismatches no truth can excuse (a missing output or
        buffer, another number of outputs)."""
        deviations, mismatches = [], []
        for i, (call, got) in enumerate(zip(calls, ran, strict=True)):
            if len(got.outputs) != len(call.outputs):
                detail = f"{len(got.outputs)} outputs, eager gives {len(call.outputs)}"
                returned = _writes_returned(got.outputs[: len(got.outputs) - len(call.outputs)], call)
                if returned:
                    detail += f": the first {'are' if len(returned) > 1 else 'is'} {', '.join(returned)}"
                    how = Mechanism(Kind.WRITE_RETURNED, Role.STATE, f"{call.method}() returns {returned[0]}")
                    mismatches.append(Mismatch(i, call.method, detail, (how,)))
                else:
                    mismatches.append(Mismatch(i, call.method, detail))
                continue
            outputs = zip(call.outputs, got.outputs, call.output_bounds(), strict=True)
            wide_after = call.wide.inputs_after if call.wide is not None else (None,) * len(call.inputs_after)
            inputs = zip(call.inputs_after, got.inputs_after, wide_after, strict=True)
            values: list[tuple[str, int | str, torch.Tensor, torch.Tensor, torch.Tensor | None]] = [
                *(("output", j, h, w, b) for j, (w, h, b) in enumerate(outputs)),
                *(("input", j, h, w, b) for j, (w, h, b) in enumerate(inputs)),
            ]
            if got.state is not None:
                for key, want in call.state_after.items():
                    have = got.state.get(key)
                    if have is None:
                        mismatches.append(
                            Mismatch(i, call.method, f"buffer {key!r} is missing from the state")
                        )
                    else:
                        values.append(("buffer", key, have, want, call.widened(key)))
            for kind, where, have, want, wide in values:
                deviation = Deviation(i, kind, where, have, want, wide)
                if not self._same_as_eager(deviation, have):
                    deviations.append(deviation)
        return deviations, mismatches

    def _detail(self, d: Deviation, calls: list[EagerCall]) -> tuple[str, str]:
        """What differs, in the words of the value: an output value by value where each reads one name (and
        whose tensor it equals), an input or buffer as its first values; and whose same-named tensor the
        value is, if another method's ("method 'prefill''s 'w'"; "" if none). Such a value is an isolation
        defect whatever the method alone gives: a cache that outlives a program (the CUDA delegate's is
        process-wide, by name) hands the method alone the same wrong tensor."""
        if d.kind == "input":
            return f"input {d.where} after the call is {_fmt(d.have)}, eager {_fmt(d.want)}", ""
        if d.kind == "buffer":
            return f"buffer {d.where!r} is {_fmt(d.have)}, eager {_fmt(d.want)}", ""
        from pytest_ptn.instruments.comparison import close

        call = calls[d.call]
        computed_in = self._computed_in(d.want)
        ok = (
            close(d.have, d.want, d.wide, self.tolerance, computed_in)
            if d.have.shape == d.want.shape
            else None
        )
        owners = self._owners(call.method, call.inputs)
        detail, read = _describe(self.read_names(call.method), d.want, d.have, ok, owners, computed_in)
        reduced = self.backend.float32_computed_in()
        if computed_in is not None and reduced is not None:
            detail += f"; {reduced.why}"
        elsewhere = self._read_elsewhere(d.call, d.have, calls)
        return detail + (f": it read {elsewhere}" if elsewhere else ""), read or elsewhere

    def _read_elsewhere(self, call: int, have: torch.Tensor, calls: list[EagerCall]) -> str:
        """For a quantized program: whose same-named quantized constant (``_frozen_param0``) the output is
        what reading gives ("method 'prefill''s '_frozen_param0'"; "" when none explains it, or the program
        is not quantized)."""
        from pytest_ptn.programs.quantized import QuantizedProgram

        program = self.program
        if not isinstance(program, QuantizedProgram):
            return ""
        found = program.read_elsewhere(call, have, self.tolerance, calls)
        return "".join(f"method {method!r}'s {key!r}" for method, key in found[:1])


@dataclass
class Ran:
    """What a loaded program gave on one call."""

    outputs: list[torch.Tensor]
    inputs_after: list[torch.Tensor]
    state: dict[str, torch.Tensor] | None
    """The state view after the call, where it was asked for."""


def _same_outputs(ours: Sequence[torch.Tensor], theirs: Sequence[torch.Tensor]) -> bool:
    """Two runs' outputs of one call are the same (pytest_ptn.instruments.comparison.equal)."""
    from pytest_ptn.instruments.comparison import equal

    return len(ours) == len(theirs) and all(map(equal, ours, theirs))


@dataclass
class Deviation:
    """A value the backend gave that differs from eager's: an output, an input after the call or a buffer."""

    call: int
    kind: str
    """``output``, ``input`` or ``buffer``."""
    where: int | str
    """The output's or input's position, or the buffer's key."""
    have: torch.Tensor
    want: torch.Tensor
    wide: torch.Tensor | None

    @property
    def what(self) -> str:
        return f"buffer {self.where!r}" if self.kind == "buffer" else f"{self.kind} {self.where}"

    def of(self, alone: CallAlone) -> torch.Tensor | None:
        """The same value in what the method alone gave (None where it gave none)."""
        import torch

        if isinstance(self.where, str):
            return alone.state_after.get(self.where)
        values: list[object] = list(alone.outputs if self.kind == "output" else alone.inputs_after)
        value = values[self.where] if self.where < len(values) else None
        return value if isinstance(value, torch.Tensor) else None


def _describe(
    names: list[str],
    want: torch.Tensor,
    have: torch.Tensor,
    ok: torch.Tensor | None,
    owners: dict[str, list[tuple[str, float]]],
    computed_in: torch.dtype | None,
) -> tuple[str, str]:
    """What differs, value by value where each value reads one name, and the first value that is what
    another method's same-named tensor gives ("method 'prefill''s 'w'"; "" when none is); ``ok`` the
    elementwise comparison (None when the shapes differ).
    ``computed_in``: the dtype the backend computed this float32 output in, whose rounding a value read from
    another method's tensor may show."""
    if ok is None:
        return f"output shape {tuple(have.shape)}, eager {tuple(want.shape)}", ""
    from pytest_ptn.instruments.comparison import allowed, difference

    parts, read = [], ""
    bound = allowed(want, computed_in=computed_in).reshape(-1)
    for k, name in enumerate(names[: want.numel()]):
        if not bool(ok.reshape(-1)[k]):
            w, h = float(want.reshape(-1)[k]), float(have.reshape(-1)[k])
            slack = float(bound[k])  # the rounding a correct computation of the same value may show
            whose = [m for m, v in owners.get(name, []) if abs(v - h) <= max(slack, 1e-4 * max(1.0, abs(v)))]
            owner = f"method {whose[0]!r}'s {name!r}" if whose else ""
            seen = f": it read {owner}" if owner else ""
            read = read or owner
            parts.append(f"value {k} (reads {name!r}) is {h:.6g}, eager {w:.6g}{seen}")
    if parts:
        return "; ".join(parts), read
    wrong = (~ok).nonzero().tolist()
    if not wrong:
        return f"output {_fmt(have)}, eager {_fmt(want)}", read
    error = float(difference(have, want).max())
    shown = ", ".join(
        f"{i} is {float(have[tuple(i)]):.6g} (eager {float(want[tuple(i)]):.6g})" for i in wrong[:3]
    )
    return f"{len(wrong)} of {want.numel()} values differ, max abs error {error:.3g}: {shown}", read


def _fmt(t: torch.Tensor) -> str:
    return str([round(v, 4) for v in t.reshape(-1).tolist()[:8]])


def fail_on(mismatches: list[Mismatch], what: str) -> None:
    """Fail the calling test with ``what`` and the first ten mismatches, one a line, without a traceback:
    the lines are the failure."""
    if mismatches:
        import pytest

        lines = "\n  ".join(str(m) for m in mismatches[:10])
        more = f"\n  ... and {len(mismatches) - 10} more" if len(mismatches) > 10 else ""
        pytest.fail(f"{what}:\n  {lines}{more}", pytrace=False)


def fail_with(findings: list[str]) -> None:
    """Fail the calling test with its findings, one a line, printed once: an ``assert not findings, ...``
    would print them twice (the message, then pytest's rendering of the list)."""
    if findings:
        import pytest

        pytest.fail("\n".join(findings), pytrace=False)


def _writes_returned(extra: list[torch.Tensor], call: EagerCall) -> list[str]:
    """The words for each of ``extra`` (the outputs a backend returned beyond eager's, which a lowering puts
    first, where buffer mutations go) if each holds a state's value after the call, as eager has it
    ("what 'step_state' holds after the call"); else none."""
    import torch

    from pytest_ptn.check.findings import Difference

    said = []
    for value in extra:
        key = next(
            (
                k
                for k, want in call.state_after.items()
                if isinstance(value, torch.Tensor)
                and value.shape == want.shape
                and Difference.between(value, want) is None
            ),
            None,
        )
        if key is None:
            return []
        said.append(f"what {key!r} holds after the call")
    return said


def check_spec(backend: Backend, spec: ProgramSpec, workdir: Path) -> list[Mismatch]:
    """Lower, load and run one program spec on ``backend`` under every load schedule: every way it differs
    from eager (E1), each mismatch naming the schedule it showed under.

    A lowering error fails the calling test with the upstream message: a valid spec must lower (E2).
    """
    from pytest_ptn.spec import Scenario

    return spec_mismatches(Case(backend, Scenario("spec", "", spec), lambda name: workdir))


def spec_mismatches(case: Case) -> list[Mismatch]:
    """``check_spec``'s mismatches of a case made from a spec."""
    sequence = [c.method for c in case.eager()]
    return [
        Mismatch(m.call, m.method, f"{m.detail} ({schedule.describe(sequence)})", m.mechanisms)
        for schedule in LoadSchedule
        for m in case.run_sequence(case.load(), schedule=schedule)
    ]
