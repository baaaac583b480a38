"""One conformance case: a backend and a scenario, with lowering cached for the session and eager truth;
``check_spec``, one program spec judged as the fuzz judges it (its ``Mismatch``: check.values).

Lowering is the slow step, so every test of one (backend, scenario) shares one lowering (or its rejection);
loading is cheap and every test gets fresh loaded copies, so state never leaks between tests.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pytest_ptn.check.values import Mismatch, Ran
from pytest_ptn.mechanisms import Mechanism, Step, raised
from pytest_ptn.run.state import LoweringCache
from pytest_ptn.schedule import LoadSchedule

if TYPE_CHECKING:
    import torch

    from pytest_ptn.backend import Backend, EagerCall, Loaded, Lowered, Ownership, Whose
    from pytest_ptn.check.alone import MethodsAlone
    from pytest_ptn.check.earlier import EarlierPrograms
    from pytest_ptn.check.replayed import ProgramReplays
    from pytest_ptn.check.values import Comparison
    from pytest_ptn.check.wrong_values import Subject
    from pytest_ptn.programs.user import UserScenario
    from pytest_ptn.run.failure import Found
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

    @cached_property
    def comparison(self) -> Comparison:
        """How this case's values are compared: the tolerance a backend that quantizes declares (None: the
        dtype's bound alone) and the backend's float32 precision."""
        from pytest_ptn.check.values import Comparison

        tolerance = self.backend.tolerance if self.quantized else None
        return Comparison(tolerance, self.backend.float32_computed_in())

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

                self.found.append(raised(Step.LOWERING, result, self.program.method_names))
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

    def ownership(self) -> Ownership | None:
        """Which of the lowered program's constants the backend under test holds, where it says
        (``Lowered.ownership``); None where it does not, or nothing lowered."""
        from pytest_ptn.backend import Lowered

        lowered = self.lowering()
        return lowered.ownership() if isinstance(lowered, Lowered) else None

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
        from pytest_ptn.check.execution import run

        loads = schedule.loads(self.program.method_names, [c.method for c in calls])
        ran: list[Ran] = []
        try:
            run(loaded, calls, loads, state, ran, self._enter)
        except BaseException:
            self.raised_at = len(ran)  # where an error of the backend's raised
            raise
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
        from pytest_ptn.check.witness import witnessed

        lowered = self.lowered()
        witness = None if isinstance(lowered, Exception) else self.backend.witness(lowered)
        if witness is None:
            return found
        seen: list[Ran] | Exception
        try:
            seen = self.run_calls(witness.loaded, calls, schedule)
        except Exception as e:
            seen = e
        said, whose = witnessed(witness, found, calls, ran, seen, self.comparison)
        self.whose |= whose
        return said

    def mismatches(
        self, calls: list[EagerCall], ran: list[Ran], schedule: LoadSchedule = LoadSchedule.UP_FRONT
    ) -> list[Mismatch]:
        """Every isolation mismatch of ``ran`` (check.wrong_values), its mechanisms noted as found."""
        from pytest_ptn.check.wrong_values import WrongValues

        mismatches = WrongValues(self.subject()).mismatches(calls, ran, schedule)
        self.found += [m for mismatch in mismatches for m in mismatch.mechanisms]
        return mismatches

    def subject(self) -> Subject:
        """What judging this case's runs reads of it (check.wrong_values): plain values, and the ways to get
        fresh exports, runs, the methods alone and replays only where a wrong value needs them."""
        from pytest_ptn.backend import Capability
        from pytest_ptn.check.wrong_values import Subject
        from pytest_ptn.programs.quantized import QuantizedProgram

        lowered, program, tolerance = self.lowered(), self.program, self.comparison.tolerance
        return Subject(
            spec=self.catalogue_spec,
            comparison=self.comparison,
            lowered=None if isinstance(lowered, Exception) else lowered,
            packaged=Capability.PACKAGE in self.backend.capabilities,
            exports=self.program.export,
            rerun=lambda calls, schedule, state: self.run_calls(self.load(), calls, schedule, state),
            alone=lambda calls: self.alone().run([(c.method, c.inputs) for c in calls]),
            replays=self.replays.of,
            shown=self.earlier.shown if self.earlier is not None else None,
            read_elsewhere=(
                (lambda call, have, calls: program.read_elsewhere(call, have, tolerance, calls))
                if isinstance(program, QuantizedProgram)
                else None
            ),
        )

    @cached_property
    def replays(self) -> ProgramReplays:
        """The faulty-binding replays of this case's program, made once for every test of the case that
        runs them, and those bound to what earlier programs held (``self.earlier``)."""
        from pytest_ptn.check.replayed import ProgramReplays
        from pytest_ptn.programs.quantized import QuantizedProgram

        program = self.program
        return ProgramReplays(
            self.scenario.name,
            program.export,
            lambda: set(program.state_fqns()),
            self._cache.replays,
            self.earlier,
            bindable=not isinstance(program, QuantizedProgram),
        )

    def accuracy(self) -> list[Mismatch]:
        """A1: where the program's results differ from eager's, how each method alone differs from eager
        (max abs, max rel, SNR, and the precision the backend declares it computes float32 in). Not
        applicable where the program does not lower, or a method alone does not: nothing to judge by. Where
        the backend has a witness, each says whose it is, as E1's do (``attributed``)."""

        from pytest_ptn.check.alone import AloneUnavailable
        from pytest_ptn.check.wrong_values import WrongValues
        from pytest_ptn.run.not_applicable import skip_not_applicable

        lowered = self.lowered()
        if isinstance(lowered, Exception):  # E2's finding
            skip_not_applicable(f"the program does not lower: {type(lowered).__name__}")
        calls = self.eager()
        try:
            ran = self.run_calls(self.load(), calls, LoadSchedule.UP_FRONT)
        except Exception as e:  # E2's or E1's finding: the program does not load or run
            skip_not_applicable(f"the program does not run: {type(e).__name__}: {e}")
        try:
            mismatches = WrongValues(self.subject()).accuracy(calls, ran)
        except AloneUnavailable as e:
            skip_not_applicable(f"no truth of the methods alone: {e}")
        return self.attributed(mismatches, calls, ran, LoadSchedule.UP_FRONT) if mismatches else mismatches

    def failure(self, error: BaseException) -> Found:
        """How a failure of this case's test came about, and whose it is: what its checks found, else, for
        an exception no check made (a load or a call that raised), the faulty binding that makes the program
        raise the same (check.explain), or that exception's own mechanism. An ``assert`` of the test itself
        is a check's finding without one: the causes read its words."""
        from pytest_ptn.backend import whose_of
        from pytest_ptn.run.failure import Found, raised_by_backend

        whose = whose_of(self.whose)
        if self.found or not raised_by_backend(error):
            return Found(tuple(self.found), whose)
        names = self.program.method_names
        said = raised(Step.RUNNING, error, names)
        if self.raised_at is not None:
            replay = self.replays.raising(error, self.eager(), self.raised_at, names)
            if replay is not None:
                return Found(replay.mechanisms, whose)
        return Found((said,), whose)


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
