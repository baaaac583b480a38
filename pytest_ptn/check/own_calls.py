"""Evidence from running the same lowered program again on a fresh load: a method's own calls with no other
method's (whose values then owe nothing to the other methods), and every method loaded up front (whose
values then owe nothing to loading late). Plain values in, and ``rerun``: a fresh load's run of some calls
under a load schedule, its state view after each call where asked."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from pytest_ptn.check.values import Comparison, Deviation, Ran, differing_calls
from pytest_ptn.schedule import LoadSchedule

if TYPE_CHECKING:
    import torch

    from pytest_ptn.backend import EagerCall
    from pytest_ptn.check.alone import CallAlone

Rerun = Callable[["list[EagerCall]", LoadSchedule, bool], "list[Ran]"]
"""A fresh load's run of some calls under a load schedule (its state view after each call where the flag
says); it raises what the backend raised."""


def other_than_on_its_own(
    exports: Callable[[], Mapping[str, torch.export.ExportedProgram]],
    calls: list[EagerCall],
    deviations: list[Deviation],
    rerun: Rerun,
    comparison: Comparison,
) -> dict[int, CallAlone]:
    """The calls of ``deviations`` (the memory plan's suspects) whose every wrong value this same lowered
    program gives otherwise when only that method's calls run (no other method loaded), where the method
    reads no state another method writes (so eager's value owes them nothing): the other methods made
    the value what it is, an isolation defect whatever the method lowered alone gives, which then need
    not be lowered (seconds a program). What the method's own calls gave, by call. ``exports``: fresh
    exported programs, made only where a call is in question."""
    from pytest_ptn.check.alone import CallAlone

    calls_of = {d.call for d in deviations}
    if not calls_of:
        return {}
    programs = exports()
    written = {m: set(ep.graph_signature.buffers_to_mutate.values()) for m, ep in programs.items()}
    out: dict[int, CallAlone] = {}
    for call in sorted(calls_of):
        method = calls[call].method
        reads = set(programs[method].graph_signature.inputs_to_buffers.values())
        if any(reads & keys for other, keys in written.items() if other != method):
            continue
        own = [c for c in calls[: call + 1] if c.method == method]
        wrong = [d for d in deviations if d.call == call]
        try:
            last = rerun(own, LoadSchedule.AT_FIRST_CALL, any(d.kind == "buffer" for d in wrong))[-1]
        except Exception:  # the method does not run on its own here: no evidence either way
            continue
        seen = CallAlone(last.outputs, last.inputs_after, last.state or {})
        if all((value := d.of(seen)) is not None and not comparison.same(d, value) for d in wrong):
            out[call] = seen
    return out


def late_only(calls: list[EagerCall], ran: list[Ran], wrong: Mapping[int, str], rerun: Rerun) -> set[int]:
    """The calls of ``wrong`` (run with each method loaded at its first call) whose values a fresh load
    of every method up front does not give: what loading a method late did, a fault of loading."""
    try:
        up_front = rerun(calls, LoadSchedule.UP_FRONT, False)
    except Exception:  # no evidence either way
        return set()
    return set(wrong) & differing_calls([r.outputs for r in ran], [r.outputs for r in up_front])
