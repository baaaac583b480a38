"""One conformance case: a backend and a scenario, with lowering cached for the session and eager truth.

Lowering is the slow step, so every test of one (backend, scenario) shares one lowering (or its rejection);
loading is cheap and every test gets fresh loaded copies, so state never leaks between tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pytest_ptn.schedule import LoadSchedule
from pytest_ptn.session import LoweringCache

if TYPE_CHECKING:
    import torch

    from pytest_ptn.backend import Backend, Loaded, Lowered, ReducedPrecision
    from pytest_ptn.comparison import Tolerance
    from pytest_ptn.programs.build import EagerCall
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

    def with_other_values(self) -> ProgramUnderTest:
        """The same names, shapes and calls holding other tensors (S4's second program)."""


@dataclass
class Mismatch:
    call: int
    method: str
    detail: str

    def __str__(self) -> str:
        return f"call #{self.call} {self.method}(): {self.detail}"


class Case:
    def __init__(
        self,
        backend: Backend,
        scenario: Scenario | UserScenario,
        workdir: Callable[[str], Path],
        cache: LoweringCache | None = None,
    ):
        """``cache`` is shared by the cases of one run (RunState.lowerings); by default a case has its own."""
        self.backend = backend
        self.scenario = scenario
        self._workdir = workdir
        self._cache = cache if cache is not None else LoweringCache()

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
        import pytest

        pytest.fail(earlier, pytrace=False)

    def lower_fresh(self) -> Lowered:
        programs = self.program.export()
        self._enter("lowering")
        return self.backend.lower(programs, self._workdir(self.scenario.name))

    def lower(self) -> Lowered:
        """The session's lowering of this case; a rejection is re-raised for every test that asks."""
        lowered = self._cache.lowered
        key = (id(self.backend), self.scenario.name)
        if key not in lowered:
            try:
                lowered[key] = self.lower_fresh()
            except Exception as e:  # kept and re-raised: the rejection is the result
                lowered[key] = e
        result = lowered[key]
        if isinstance(result, Exception):
            if self.scenario.valid:  # quote the upstream message, not its traceback
                import pytest

                pytest.fail(f"lowering failed: {type(result).__name__}: {result}", pytrace=False)
            raise result
        return result

    def lowering(self) -> Lowered | Exception | None:
        """What the session's lowering of this case gave, without lowering (None if no test lowered it yet):
        a repro bundle copies the artifact the failing test loaded."""
        return self._cache.lowered.get((id(self.backend), self.scenario.name))

    def load(self) -> Loaded:
        lowered = self.lower()
        self._enter("loading")
        return self.backend.load(lowered)

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

    def run_sequence(
        self,
        loaded: Loaded,
        calls: list[EagerCall] | None = None,
        schedule: LoadSchedule = LoadSchedule.AT_FIRST_CALL,
    ) -> list[Mismatch]:
        """Run the call sequence on ``loaded``, methods loaded as ``schedule`` says; every way it differs from
        eager (pytest_ptn.comparison decides what is equal). A backend that computes float32 in a coarser
        dtype here (Backend.float32_computed_in) gets each float32 difference labelled with that, and with
        whether that dtype's rounding accounts for it; the comparison itself stays float32."""
        import torch

        from pytest_ptn.comparison import close, equal

        reduced = self.backend.float32_computed_in()
        mismatches = []
        calls = calls if calls is not None else self.eager()
        loads = schedule.loads(self.program.method_names, [c.method for c in calls])
        for i, (call, to_load) in enumerate(zip(calls, loads, strict=True)):
            for method in to_load:
                self._enter(f"loading {method}()")
                loaded.load_method(method)
            given = [t.clone() for t in call.inputs]
            self._enter(f"running {call.method}()")
            got = loaded.run(call.method, given)
            if len(got) != len(call.outputs):
                mismatches.append(
                    Mismatch(i, call.method, f"{len(got)} outputs, eager gives {len(call.outputs)}")
                )
                continue
            names = self.read_names(call.method)
            tolerance = self.tolerance
            for want, have, wide in zip(call.outputs, got, call.output_bounds(), strict=True):
                if not equal(have, want, wide, tolerance):
                    ok = close(have, want, wide, tolerance) if have.shape == want.shape else None
                    labelled = reduced if want.dtype == torch.float32 else None
                    coarser = getattr(torch, labelled.dtype) if labelled is not None else None
                    owners = self._owners(call.method, call.inputs)
                    detail = _describe(names, want, have, ok, owners, coarser)
                    if labelled is not None:
                        detail += f"; {_precision_label(labelled, have, want)}"
                    mismatches.append(Mismatch(i, call.method, detail + self._read_elsewhere(i, have, calls)))
            wide_after = call.wide.inputs_after if call.wide is not None else (None,) * len(given)
            for j, (want, have, wide) in enumerate(zip(call.inputs_after, given, wide_after, strict=True)):
                if not equal(have, want, wide, tolerance):
                    mismatches.append(
                        Mismatch(
                            i, call.method, f"input {j} after the call is {_fmt(have)}, eager {_fmt(want)}"
                        )
                    )
        return mismatches

    def _read_elsewhere(self, call: int, have: torch.Tensor, calls: list[EagerCall]) -> str:
        """For a quantized program: whose same-named quantized constant (``_frozen_param0``) the output is
        what reading gives ("" when none explains it, or the program is not quantized)."""
        from pytest_ptn.programs.quantized import QuantizedProgram

        program = self.program
        if not isinstance(program, QuantizedProgram):
            return ""
        found = program.read_elsewhere(call, have, self.tolerance, calls)
        return "".join(f": it read method {method!r}'s {key!r}" for method, key in found[:1])


def _describe(
    names: list[str],
    want: torch.Tensor,
    have: torch.Tensor,
    ok: torch.Tensor | None,
    owners: dict[str, list[tuple[str, float]]],
    coarser: torch.dtype | None,
) -> str:
    """What differs, value by value where each value reads one name; ``ok`` the elementwise comparison (None
    when the shapes differ). ``coarser``: the dtype the backend computed this float32 output in, whose
    rounding a value read from another method's tensor may show."""
    if ok is None:
        return f"output shape {tuple(have.shape)}, eager {tuple(want.shape)}"
    from pytest_ptn.comparison import allowed

    parts = []
    bound = allowed(want if coarser is None else want.to(coarser)).reshape(-1)
    for k, name in enumerate(names[: want.numel()]):
        if not bool(ok.reshape(-1)[k]):
            w, h = float(want.reshape(-1)[k]), float(have.reshape(-1)[k])
            slack = float(bound[k])  # the rounding a correct computation of the same value may show
            whose = [m for m, v in owners.get(name, []) if abs(v - h) <= max(slack, 1e-4 * max(1.0, abs(v)))]
            seen = f": it read method {whose[0]!r}'s {name!r}" if whose else ""
            parts.append(f"value {k} (reads {name!r}) is {h:.6g}, eager {w:.6g}{seen}")
    return "; ".join(parts) or f"output {_fmt(have)}, eager {_fmt(want)}"


def _precision_label(reduced: ReducedPrecision, have: torch.Tensor, want: torch.Tensor) -> str:
    """What a float32 difference of a backend computing in a coarser dtype is, by that dtype's rounding."""
    import torch

    from pytest_ptn.comparison import within_rounding

    if within_rounding(have, want, getattr(torch, reduced.dtype)):
        return (
            f"{reduced.why}: within {reduced.dtype} rounding of eager (two {reduced.dtype} steps of each "
            "value), a precision deviation, not another method's tensor; still a failure of a float32 program"
        )
    return f"{reduced.why}: beyond {reduced.dtype} rounding of eager as well, which does not explain it"


def _fmt(t: torch.Tensor) -> str:
    return str([round(v, 4) for v in t.reshape(-1).tolist()[:8]])


def fail_on(mismatches: list[Mismatch], what: str) -> None:
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

    case = Case(backend, Scenario("spec", "", spec), lambda name: workdir)
    sequence = [c.method for c in case.eager()]
    return [
        Mismatch(m.call, m.method, f"{m.detail} ({schedule.describe(sequence)})")
        for schedule in LoadSchedule
        for m in case.run_sequence(case.load(), schedule=schedule)
    ]
