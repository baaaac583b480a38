"""What check_program found, as data: the rule, the step it showed in, where, and by how much."""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from pytest_ptn.check.hazards import Hazards
    from pytest_ptn.instruments.comparison import Tolerance
    from pytest_ptn.mechanisms import Mechanism

SHOWN_ELEMENTS = 3
"""How many differing elements a finding lists."""


class Stage(enum.StrEnum):
    """The step of the check where a finding showed."""

    LOWER = "lower"
    """Lowering the program through the backend (E2; P7 and X1 for a program the rules reject)."""
    LOAD = "load"
    """Loading the lowered program or one of its methods (E2)."""
    RUN = "run"
    """A call that raised (E1)."""
    COMPARE = "compare"
    """A call's outputs or state compared with the truth (E1, E3-E5, A1)."""
    PACKAGE = "package"
    """The package read back from the file (P1-P5)."""
    STORAGE = "storage"
    """Which constants share one allocation (S1-S3, S5, S7)."""


@dataclass(frozen=True)
class Difference:
    """How far a tensor the backend gave is from eager's."""

    max_abs: float
    """The largest absolute error."""
    max_rel: float
    """The largest error relative to eager's value."""
    differing: int
    """How many elements differ beyond the bound."""
    total: int
    """How many elements the tensor has."""
    first: tuple[tuple[tuple[int, ...], float, float], ...]
    """The first differing elements: (index, backend's value, eager value)."""
    snr_db: float = math.inf
    """Signal-to-noise ratio against eager, in dB (pytest_ptn.instruments.comparison.snr_db)."""

    @classmethod
    def between(
        cls,
        have: torch.Tensor,
        want: torch.Tensor,
        wide: torch.Tensor | None = None,
        tolerance: Tolerance | None = None,
        computed_in: torch.dtype | None = None,
    ) -> Difference | None:
        """None when ``have`` equals ``want`` within the bound of pytest_ptn.instruments.comparison (same
        shape required; ``wide``: eager's float64 counterpart of a reduced-precision ``want``; ``tolerance``
        and ``computed_in`` as the backend declares them)."""
        import torch

        from pytest_ptn.instruments.comparison import FLOOR, close, difference, snr_db

        ok = close(have, want, wide, tolerance, computed_in)
        if bool(ok.all()):
            return None
        snr = snr_db(have, want)
        error = difference(have, want)
        have, want = have.detach().to(torch.float64), want.detach().to(torch.float64)
        rel = error / want.abs().clamp_min(FLOOR)
        wrong = (~ok).nonzero().tolist()[:SHOWN_ELEMENTS]
        first = tuple((tuple(i), float(have[tuple(i)]), float(want[tuple(i)])) for i in wrong)
        return cls(float(error.max()), float(rel.max()), int((~ok).sum()), want.numel(), first, snr)

    def __str__(self) -> str:
        shown = ", ".join(f"{list(i)} is {h:.6g} (eager {w:.6g})" for i, h, w in self.first)
        return (
            f"{self.differing} of {self.total} elements differ, max abs error {self.max_abs:.3g}, "
            f"max rel error {self.max_rel:.3g}, SNR {self.snr_db:.1f} dB; {shown}"
        )


@dataclass(frozen=True)
class Finding:
    """One way the backend broke a rule on the user's program; ``str()`` is the line to show."""

    rule: str
    """The rule broken: ``E1``, ``P3``, ..."""
    stage: Stage
    """The step of the check it showed in."""
    detail: str
    """What was wrong, in words."""
    method: str | None = None
    """The method it is about, if one."""
    call: int | None = None
    """Index in the call sequence, for findings made while running it."""
    difference: Difference | None = None
    """How far the value is from the truth, for a finding of a wrong value."""
    explanation: str | None = None
    """What the wrong values equal, e.g. "what method 'prefill''s 'weight' would give"."""
    mechanisms: tuple[Mechanism, ...] = ()
    """How it came about, as the replay that gives the wrong values says (none: not accounted for)."""
    whose: str | None = None
    """Whose the failure is, for a backend with a witness (``Backend.witness``), as the witness says it:
    "executorch.runtime on the same .pte gives eager's values: the runtime's own"."""

    def __str__(self) -> str:
        if self.call is not None:
            where = f"call #{self.call} {self.method}(): "
        elif self.method is not None:
            where = f"method {self.method!r}: "
        else:
            where = ""
        line = f"{self.rule}: {where}{self.detail}"
        if self.difference is not None:
            line += f": {self.difference}"
        if self.explanation is not None:
            line += f"; it equals {self.explanation}"
        if self.whose is not None:
            line += f"; {self.whose}"
        return line


class Findings(list[Finding]):
    """check_program's findings, a plain list (``[]`` when clean), with the program's ``hazards``: what it
    holds that the rules are about, and the rules it left with no case to check."""

    def __init__(self, findings: Iterable[Finding], hazards: Hazards):
        super().__init__(findings)
        self.hazards = hazards
        """What the program holds that the rules are about, and the rules it left with no case to check."""
