"""Whose each failure of check_program is, for a backend with a witness (``Backend.witness``: for a runtime of
.pte files, executorch.runtime on the same .pte), as the conformance suite's failures say it.

The witness loads the same artifact and runs the same calls, methods loaded as the backend's copy loaded
them: a value it gives too is the lowering's (or upstream's), eager's value where the backend's differs is
the runtime's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pytest_ptn.backend import Witness
from pytest_ptn.check.execution import Compared
from pytest_ptn.check.findings import Finding, Stage
from pytest_ptn.instruments.comparison import equal

ATTRIBUTED = "E1"
"""The rule whose findings the witness can speak to: the values each call gives (the witness is not asked
for a state view)."""


def attributed(
    witness: Witness,
    findings: list[Finding],
    differing: list[Compared],
    theirs: list[Finding],
    their_differing: Sequence[Compared],
) -> tuple[list[Finding], list[Compared]]:
    """``findings`` and ``differing`` of the backend's run, each E1 finding saying whose it is (``whose``),
    from the witness's run of the same calls (``theirs``, ``their_differing``)."""
    values = {id(c.finding): c for c in differing}
    their_values = {(c.finding.call, c.finding.detail): c for c in their_differing}
    stopped = next((f for f in theirs if f.stage in (Stage.LOAD, Stage.RUN)), None)

    def says(f: Finding) -> str:
        assert f.call is not None
        if stopped is not None and (stopped.call is None or stopped.call <= f.call):
            if f.stage == Stage.RUN and stopped.call == f.call:
                return witness.says(True, False)  # it raised too
            return f"{witness.by}: {stopped.detail}"
        at_call = [t.detail for t in theirs if t.call == f.call]
        if f.stage == Stage.RUN:
            return witness.says(False, not at_call)
        mine, same_value = values.get(id(f)), their_values.get((f.call, f.detail))
        if mine is not None and same_value is not None:
            return witness.says(equal(mine.have, same_value.have), False)
        if f.detail in at_call:
            return witness.says(True, False)  # missing, or of the same other shape
        return witness.says(False, not any(_of_one_value(f.detail, t) for t in at_call))

    told = {
        id(f): dataclasses.replace(f, whose=says(f))
        for f in findings
        if f.rule == ATTRIBUTED and f.call is not None
    }
    return (
        [told.get(id(f), f) for f in findings],
        [dataclasses.replace(c, finding=told.get(id(c.finding), c.finding)) for c in differing],
    )


def _of_one_value(detail: str, other: str) -> bool:
    """Whether two findings of one call are about the same value (``output 0`` and ``output 0 has shape
    (2,), eager (4,)``)."""
    return detail == other or detail.startswith(f"{other} ") or other.startswith(f"{detail} ")
