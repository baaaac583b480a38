"""Whose a wrong call is, for a backend with a witness (``Backend.witness``: for a runtime of .pte files,
executorch.runtime on the same .pte), as the scenario tests, the fuzz and check_program all say it.

The witness loads the same artifact and runs the same calls, methods loaded as the backend's copy loaded
them: a value it gives too is the lowering's (or upstream's), eager's value where the backend's differs is
the runtime's own.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from pytest_ptn.backend import one_line

if TYPE_CHECKING:
    from pytest_ptn.backend import EagerCall, Whose, Witness
    from pytest_ptn.check.values import Comparison, Mismatch, Ran


def testimony(
    witness: Witness, ours: Ran | Exception, theirs: Ran | Exception, call: EagerCall, comparison: Comparison
) -> tuple[str, Whose | None]:
    """What the witness's run of a call (``theirs``: what it gave, or what it raised at or before this call)
    says of the backend's (``ours``: what it gave, or what it raised at this call), and whose that makes it
    (None: the witness does not tell)."""
    from pytest_ptn.check.values import same_outputs
    from pytest_ptn.instruments.comparison import equal

    if isinstance(theirs, Exception):
        if not isinstance(ours, Exception):
            return f"{witness.by} raised {one_line(theirs)}", None
        same, eager = True, False  # it raised too
    else:
        bounds = call.output_bounds()
        eager = len(theirs.outputs) == len(call.outputs) and all(
            equal(t, e, b, comparison.tolerance, comparison.computed_in(e))
            for t, e, b in zip(theirs.outputs, call.outputs, bounds, strict=True)
        )
        same = not isinstance(ours, Exception) and same_outputs(ours.outputs, theirs.outputs)
    return witness.says(same, eager), witness.whose(same, eager)


def witnessed(
    witness: Witness,
    found: list[Mismatch],
    calls: list[EagerCall],
    ran: list[Ran],
    seen: list[Ran] | Exception,
    comparison: Comparison,
) -> tuple[list[Mismatch], set[Whose]]:
    """``found``, each saying what the witness gave on the same calls and schedule (``seen``, or what it
    raised; ``testimony``), and whose they are, where the witness tells."""
    out, whose = [], set()
    for m in found:
        theirs = seen if isinstance(seen, Exception) else seen[m.call]
        said, who = testimony(witness, ran[m.call], theirs, calls[m.call], comparison)
        out.append(dataclasses.replace(m, detail=f"{m.detail}; {said}"))
        if who is not None:
            whose.add(who)
    return out, whose
