"""The judging of one run of a call sequence, as the scenario tests, the fuzz, ``check_spec`` and
``check_program`` all do it: the values that differ from eager (check.values), then the evidence of how each
came about (the faulty-binding replays, check.explain; the memory plan, check.memory_plan; the method's own
calls, check.own_calls; the package, check.package), then what the method alone gives (check.alone): the
isolation defects, each with its mechanisms (``Wrong``), and beside them the accuracy ones (A1). Each front
end words them its own way: a scenario test's ``Mismatch`` lines, check_program's findings (check.judge).

It reads its case through ``Subject``: plain values, and the runs, programs and replays it asks for only
where a wrong value needs them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from pytest_ptn.check import reads
from pytest_ptn.check.values import Comparison, Deviation, Mismatch, Ran, describe, fmt
from pytest_ptn.mechanisms import Kind, Mechanism, isolation_only
from pytest_ptn.schedule import LoadSchedule

if TYPE_CHECKING:
    import torch

    from pytest_ptn.backend import EagerCall, Lowered
    from pytest_ptn.check.alone import CallAlone
    from pytest_ptn.check.explain import Replay, Replays
    from pytest_ptn.check.own_calls import Rerun
    from pytest_ptn.spec import ProgramSpec


@dataclass(frozen=True)
class Subject:
    """What judging a run reads of its case."""

    spec: ProgramSpec | None
    """The catalogue spec the program is built from; None for a user program."""
    comparison: Comparison
    lowered: Lowered | None
    """The lowered program whose memory plan and package are evidence (None: not at hand)."""
    packaged: bool
    """The backend has a package view (Capability.PACKAGE)."""
    exports: Callable[[], dict[str, torch.export.ExportedProgram]]
    """Fresh exported programs, one per method."""
    rerun: Rerun
    alone: Callable[[list[EagerCall]], list[CallAlone]]
    """What each call gives with its method alone (check.alone); raises AloneUnavailable."""
    replays: Callable[[list[EagerCall], bool], Replays]
    """The faulty-binding replays of some calls; with the flag, also those bound to what earlier programs
    held."""
    shown: Mapping[Kind, int] | None
    """The kinds the process's earlier programs showed (check.earlier); None where none are recorded."""
    read_elsewhere: Callable[[int, torch.Tensor, list[EagerCall]], list[tuple[str, str]]] | None
    """For a quantized program: each (method, key) whose same-named quantized constant a call's output is
    what reading gives (programs.quantized); None for a program that is not quantized."""


class CallEvidence(NamedTuple):
    """What the evidence says of a run's deviations, by call."""

    words: list[str]
    """Each deviation in words (``WrongValues._detail``)."""
    labels: list[str]
    """What the replay that gives each deviation gives (``Wrong.label``)."""
    explained: dict[int, tuple[Mechanism, ...]]
    """The calls a faulty binding's replay, or a by-name read, accounts for."""
    planned: dict[int, tuple[Mechanism, ...]]
    """The calls the memory plan puts where another method keeps tensors."""
    own: dict[int, CallAlone]
    """What a method's own calls give, where they give otherwise (check.own_calls)."""
    stored: dict[int, tuple[Mechanism, ...]]
    """The calls whose method the package binds by name to another method's tensor."""
    forced: set[int]
    """The calls that are isolation defects whatever the method alone gives."""


@dataclass(frozen=True)
class Wrong:
    """One value of a run that is wrong, and what the evidence says of it: each front end words it its own
    way (a scenario test's ``Mismatch``, check_program's ``Finding``)."""

    deviation: Deviation
    method: str
    words: str
    """The value in words: value by value where each reads one name, and whose tensor it read."""
    label: str
    """What the faulty binding that gives the same output gives ("what method 'prefill''s 'w' would give";
    "" for none, or a value other than an output)."""
    notes: tuple[str, ...]
    """What else the evidence says, each with its separator: the method alone, the memory plan, the
    package, the method's own calls."""
    mechanisms: tuple[Mechanism, ...] = ()
    truth: torch.Tensor | None = None
    """What the method alone gives for the value, where it was asked."""

    def mismatch(self) -> Mismatch:
        said = f"; it equals {self.label}" if self.label else ""
        detail = self.words + said + "".join(self.notes)
        return Mismatch(self.deviation.call, self.method, detail, self.mechanisms)


class WrongValues:
    """The isolation and accuracy mismatches of a subject's runs."""

    def __init__(self, subject: Subject):
        self.subject = subject
        self.comparison = subject.comparison
        self._gathered: tuple[list[Ran], LoadSchedule, CallEvidence] | None = None
        """The last run's evidence: a run judged for isolation, then for accuracy, gathers it once (its
        own-calls reruns, its package read)."""

    def mismatches(
        self, calls: list[EagerCall], ran: list[Ran], schedule: LoadSchedule = LoadSchedule.UP_FRONT
    ) -> list[Mismatch]:
        """``judged``'s findings as the lines a failure shows."""
        wrong, mismatches = self.judged(calls, ran, schedule)
        return sorted([*mismatches, *(w.mismatch() for w in wrong)], key=lambda m: m.call)

    def judged(
        self, calls: list[EagerCall], ran: list[Ran], schedule: LoadSchedule = LoadSchedule.UP_FRONT
    ) -> tuple[list[Wrong], list[Mismatch]]:
        """Each output, mutated input and (where ``ran`` has it) buffer that differs from eager
        (pytest_ptn.instruments.comparison) and from what the method alone gives on this backend: an
        isolation defect; and the mismatches no truth can excuse (check.values.Comparison.deviations). A
        difference the method alone shows too is its arithmetic, accuracy's business (``accuracy``), unless
        the method alone is itself far beyond the backend's accuracy on the other methods
        (check.alone.suspects): then it stays an isolation defect, saying so. Where no method alone can be
        had, the difference is reported against eager, saying so."""
        from pytest_ptn.check.alone import suspects

        comparison = self.comparison
        deviations, mismatches = comparison.deviations(calls, ran)
        if not deviations:
            return [], mismatches
        found = self._evidence(deviations, calls, ran, schedule)
        words, labels, explained, planned, own, stored, forced = found
        unexplained = [d for d in deviations if d.call not in forced]
        alone, unavailable = self._alone(calls) if unexplained else (None, None)
        suspect = suspects(alone, [(c.method, c.outputs) for c in calls]) if alone is not None else {}
        wrong = []
        for d, said, label in zip(deviations, words, labels, strict=True):
            truth = d.of(alone[d.call]) if alone is not None else None
            method = calls[d.call].method
            notes = []
            if d.call not in forced and truth is not None and comparison.same(d, truth):
                if method not in suspect:
                    continue  # the method alone computes it so: accuracy, not isolation
                notes.append(f"; {suspect[method]}")
            elif truth is not None and not comparison.same_as_eager(d, truth):
                notes.append(f"; alone, the method gives {fmt(truth)}")
            if unavailable is not None and d.call not in forced:
                notes.append(f" (judged against eager: {unavailable})")
            how = explained.get(d.call) or planned.get(d.call) or stored.get(d.call) or ()
            if d.call not in explained and (other := planned.get(d.call) or stored.get(d.call)):
                notes.append(f"; {'; '.join(m.detail for m in other)}")
            if d.call not in explained and d.call in own and (value := d.of(own[d.call])) is not None:
                notes.append(f"; with no other method's calls, this program's {d.what} is {fmt(value)}")
            wrong.append(Wrong(d, method, said, label, tuple(notes), how, truth))
        return wrong, mismatches

    def accuracy(self, calls: list[EagerCall], ran: list[Ran]) -> list[Mismatch]:
        """``inaccurate``'s findings as the lines a failure shows (max abs, max rel, SNR)."""
        from pytest_ptn.check.findings import Difference

        comparison, mismatches = self.comparison, []
        for w in self.inaccurate(calls, ran):
            d, truth = w.deviation, w.truth
            assert truth is not None
            if truth.shape != d.want.shape:
                detail = f"{d.what} has shape {tuple(truth.shape)}, eager {tuple(d.want.shape)}"
            else:
                computed_in = comparison.computed_in(d.want)
                difference = Difference.between(truth, d.want, d.wide, comparison.tolerance, computed_in)
                detail = f"{d.what}: {difference}"
            mismatches.append(Mismatch(d.call, w.method, detail + "".join(w.notes)))
        return mismatches

    def inaccurate(self, calls: list[EagerCall], ran: list[Ran]) -> list[Wrong]:
        """A1: where ``ran`` (every method loaded up front) differs from eager and no faulty binding explains
        it, each value the method alone gives otherwise than eager (``Wrong.truth``), noting the precision
        the backend declares it computes float32 in. Raises AloneUnavailable where no method alone can be
        had."""
        import torch

        from pytest_ptn.check.alone import suspects

        comparison = self.comparison
        deviations, _ = comparison.deviations(calls, ran)
        if deviations:  # a value a faulty binding explains is isolation's, whatever the method alone gives
            forced = self._evidence(deviations, calls, ran, LoadSchedule.UP_FRONT).forced
            deviations = [d for d in deviations if d.call not in forced]
        if not deviations:
            return []
        alone = self.subject.alone(calls)
        reduced = comparison.reduced
        suspect = suspects(alone, [(c.method, c.outputs) for c in calls])
        out = []
        for d in deviations:
            truth = d.of(alone[d.call])
            if truth is None or comparison.same_as_eager(d, truth):
                continue  # alone, the method agrees with eager: the program's difference is isolation's
            method = calls[d.call].method
            notes = []
            if reduced is not None and d.want.dtype == torch.float32:
                notes.append(f"; {reduced.why}")
            if method in suspect:
                notes.append(f"; {suspect[method]}")
            out.append(Wrong(d, method, "", "", tuple(notes), truth=truth))
        return out

    def _evidence(
        self, deviations: list[Deviation], calls: list[EagerCall], ran: list[Ran], schedule: LoadSchedule
    ) -> CallEvidence:
        """What the replays, the memory plan, the method's own calls and the package say of ``deviations``
        (each in that order, for the calls the ones before leave unexplained)."""
        from pytest_ptn.check.own_calls import other_than_on_its_own

        gathered = self._gathered
        if gathered is not None and gathered[0] is ran and gathered[1] is schedule:
            return gathered[2]
        subject = self.subject
        words, labels, explained = self._explained(deviations, calls, ran, schedule)
        forced = {call for call, how in explained.items() if any(isolation_only(m) for m in how)}
        planned = self._planned_together(calls, [d for d in deviations if d.call not in explained])
        suspected = [d for d in deviations if d.call in planned]
        own = other_than_on_its_own(subject.exports, calls, suspected, subject.rerun, self.comparison)
        accounted = explained.keys() | planned.keys()
        stored = self._stored_otherwise(calls, [d for d in deviations if d.call not in accounted])
        forced |= own.keys() | stored.keys()
        evidence = CallEvidence(words, labels, explained, planned, own, stored, forced)
        self._gathered = (ran, schedule, evidence)
        return evidence

    def _alone(self, calls: list[EagerCall]) -> tuple[list[CallAlone] | None, str | None]:
        from pytest_ptn.check.alone import AloneUnavailable

        try:
            return self.subject.alone(calls), None
        except AloneUnavailable as e:
            return None, f"no truth of the method alone: {e}"

    def _stored_otherwise(
        self, calls: list[EagerCall], deviations: list[Deviation]
    ) -> dict[int, tuple[Mechanism, ...]]:
        """For each call of ``deviations`` nothing else explains: the tensors of its method the lowered
        package binds by name to another method's stored tensor of another dtype or shape
        (check.package.bound_elsewhere)."""
        from pytest_ptn.check.package import bound_elsewhere

        subject = self.subject
        if not deviations or not subject.packaged or subject.lowered is None:
            return {}
        methods = [c.method for c in calls]
        wrong = [
            (d.call, methods[d.call], reads.may_read(subject.spec, methods[d.call], d)) for d in deviations
        ]
        return bound_elsewhere(subject.lowered.package(), subject.exports(), wrong)

    def _planned_together(
        self, calls: list[EagerCall], deviations: list[Deviation]
    ) -> dict[int, tuple[Mechanism, ...]]:
        """For each call of ``deviations`` no replay explains: the state of its method whose planned memory
        the tensors of a method that ran before it also use, as the lowered program's own memory plan says
        (``Lowered.shared_memory``): what that method left there is what the state reads."""
        from pytest_ptn.check.memory_plan import planned_together

        lowered = self.subject.lowered
        if not deviations or lowered is None:
            return {}
        methods = [c.method for c in calls]
        wrong = [(d.call, reads.may_read(self.subject.spec, methods[d.call], d)) for d in deviations]
        return planned_together(lowered.shared_memory(), methods, wrong)

    def _explained(
        self, deviations: list[Deviation], calls: list[EagerCall], ran: list[Ran], schedule: LoadSchedule
    ) -> tuple[list[str], list[str], dict[int, tuple[Mechanism, ...]]]:
        """Each deviation's words and the label of the replay that gives it (an output's; "" for none), and
        the calls whose wrong values a faulty binding accounts for: another method's same-named tensor, a
        private copy of shared state, two buffers in one memory (pytest_ptn.check.explain). Such a call is
        an isolation defect whatever the method alone gives (a cache that outlives a program, as the CUDA
        delegate's is, hands the method alone the same tensor), and it needs no method lowered alone."""
        from pytest_ptn.check.explain import label_of, mechanisms_of

        words: list[str] = []
        explained: dict[int, tuple[Mechanism, ...]] = {}
        for d in deviations:
            said, read = self._detail(d, calls)
            words.append(said)
            if read:
                method = calls[d.call].method
                role = reads.role_of_read(self.subject.spec, method)
                explained[d.call] = (Mechanism(Kind.BY_NAME, role, f"method {method!r} read {read}"),)
        wrong = {d.call: calls[d.call].method for d in deviations if d.kind == "output"}
        wrong = {call: method for call, method in wrong.items() if call not in explained}
        replays = self._bindings(calls, ran, wrong, schedule) if wrong else {}
        labels = [
            label_of(replays[d.call]) if d.kind == "output" and d.call in replays else "" for d in deviations
        ]
        return words, labels, explained | {call: mechanisms_of(found) for call, found in replays.items()}

    def _bindings(
        self, calls: list[EagerCall], ran: list[Ran], wrong: dict[int, str], schedule: LoadSchedule
    ) -> dict[int, tuple[Replay, ...]]:
        """What faulty bindings give for each call of ``wrong`` they account for (check.explain)."""
        from pytest_ptn.check.explain import explanations
        from pytest_ptn.check.own_calls import late_only

        subject = self.subject
        replays = subject.replays(calls, False)
        late = (
            late_only(calls, ran, wrong, subject.rerun)
            if schedule is LoadSchedule.AT_FIRST_CALL and any(r.schedule for r in replays)
            else set()
        )
        eager = [c.outputs for c in calls]
        shown = subject.shown
        found = explanations(replays, [r.outputs for r in ran], wrong, schedule, late, eager, shown)
        if shown is None or all(any(not r.weak for r in found.get(call, ())) for call in wrong):
            return found
        # something the program alone does not account for, or only by metadata: what earlier programs held
        # (exported only now, for the few programs that need it)
        replays = subject.replays(calls, True)
        return explanations(replays, [r.outputs for r in ran], wrong, schedule, late, eager, shown)

    def _detail(self, d: Deviation, calls: list[EagerCall]) -> tuple[str, str]:
        """What differs, in the words of the value: an output value by value where each reads one name (and
        whose tensor it equals), an input or buffer as its first values; and whose same-named tensor the
        value is, if another method's ("method 'prefill''s 'w'"; "" if none). Such a value is an isolation
        defect whatever the method alone gives: a cache that outlives a program (the CUDA delegate's is
        process-wide, by name) hands the method alone the same wrong tensor."""
        if d.kind == "input":
            return f"input {d.where} after the call is {fmt(d.have)}, eager {fmt(d.want)}", ""
        if d.kind == "buffer":
            return f"buffer {d.where!r} is {fmt(d.have)}, eager {fmt(d.want)}", ""
        from pytest_ptn.instruments.comparison import close

        call, comparison, spec = calls[d.call], self.comparison, self.subject.spec
        computed_in = comparison.computed_in(d.want)
        ok = (
            close(d.have, d.want, d.wide, comparison.tolerance, computed_in)
            if d.have.shape == d.want.shape
            else None
        )
        owners = reads.owners(spec, call.method, call.inputs)
        detail, read = describe(reads.read_names(spec, call.method), d.want, d.have, ok, owners, computed_in)
        reduced = comparison.reduced
        if computed_in is not None and reduced is not None:
            detail += f"; {reduced.why}"
        reading = self.subject.read_elsewhere
        found = reading(d.call, d.have, calls)[:1] if reading is not None else []
        elsewhere = "".join(f"method {method!r}'s {key!r}" for method, key in found)
        return detail + (f": it read {elsewhere}" if elsewhere else ""), read or elsewhere
