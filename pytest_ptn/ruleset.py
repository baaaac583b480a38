"""The numbered rules of the conformance spec as data, and the words a test's outcome is told in, so markers,
reports and tests share one list and one vocabulary."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_ptn.backend import Backend, Capability

SPEC_VERSION = "6"
"""2: isolation is judged against each method alone on the same backend, and accuracy (A1) is its own rule;
3: the methods alone share nothing with the program's run (a fresh process); 4: the fuzz sees past known bugs,
a backend's known failures of generated programs listed by mechanism (pytest_ptn.mechanisms); 5: one bug, one
mechanism (an error a faulty binding reproduces is that binding's), content that only looks the same
(``lookalike``) in the scenarios and the fuzz, and a derandomized profile's programs whatever the split; 6:
the programs hold what real programs hold, found by surveying them (pytest_ptn.programs.survey: nested paths
whose leaves repeat across layers and methods, state per layer, tied and non-contiguous tensors), their
tensors related from one lattice (differences at every magnitude down to the comparison bound), and a value a
binding of the wrong data explains (a tensor's layout lost, a constant bound to state) is an E failure
whatever the method alone gives."""

MUST = "MUST"
SHOULD = "SHOULD"
LEVELS = (MUST, SHOULD)

NOT_APPLICABLE_PREFIX = "not applicable"
"""How a not applicable skip's reason starts, for people; the reports tell the outcome by the skip's type
(``run.not_applicable``), never by these words."""
SHOULD_NOT_MET_PREFIX = "SHOULD rule"
"""How the reason of a failed SHOULD test, an xfail to pytest, starts, for people; the plugin marks the
outcome a failure of that rule as a property (``run.not_applicable.OUTCOME_PROPERTY``)."""
STRICT_XPASS_PREFIX = "[XPASS(strict)]"
"""How pytest starts the failure text of a strict xfail that passed (a stale known failure)."""


def not_applicable(reason: str) -> str:
    """The skip reason of a test that cannot apply to this backend or scenario."""
    return f"{NOT_APPLICABLE_PREFIX}: {reason}"


def should_not_met(rules: list[str]) -> str:
    """The xfail reason a failed SHOULD test is reported with."""
    return f"{SHOULD_NOT_MET_PREFIX} {', '.join(rules)} not met"


def is_strict_xpass(longrepr: object) -> bool:
    return isinstance(longrepr, str) and longrepr.startswith(STRICT_XPASS_PREFIX)


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    level: str  # one of LEVELS

    @property
    def family(self) -> str:
        return self.id[0]


RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        Rule("P1", "method namespace", "MUST"),
        Rule("P2", "shared state", "MUST"),
        Rule("P3", "complete rewrite", "MUST"),
        Rule("P4", "content dedupe", "MUST"),
        Rule("P5", "state is never deduped", "MUST"),
        Rule("P6", "reserved namespace", "MUST"),
        Rule("P7", "state conflict", "MUST"),
        Rule("P8", "final-name collision", "MUST"),
        Rule("P9", "deterministic", "SHOULD"),
        Rule("P10", "atomic save", "SHOULD"),
        Rule("E1", "isolation", "MUST"),
        Rule("E2", "valid programs load", "MUST"),
        Rule("E3", "shared state", "MUST"),
        Rule("E4", "private state", "MUST"),
        Rule("E5", "eager initial values", "MUST"),
        Rule("S1", "share what is identical", "MUST"),
        Rule("S2", "never share what differs", "MUST"),
        Rule("S3", "total collision", "MUST"),
        Rule("S4", "no cross-program leak", "MUST"),
        Rule("S5", "order independence", "MUST"),
        Rule("S6", "no memory penalty", "MUST"),
        Rule("S7", "concurrent loads", "SHOULD"),
        Rule("X1", "clear rejection", "MUST"),
        Rule("X2", "malformed packages", "MUST"),
        Rule("A1", "agrees with eager", "SHOULD"),
    )
}


RULE_NEEDS: dict[str, frozenset[Capability]] = {
    **{r: frozenset({Capability.PACKAGE}) for r in RULES if r.startswith("P")},
    **{r: frozenset({Capability.EXECUTE}) for r in RULES if r.startswith("E")},
    **{r: frozenset({Capability.EXECUTE, Capability.STORAGE}) for r in ("S1", "S2", "S3", "S4", "S5", "S7")},
    "S6": frozenset({Capability.EXECUTE, Capability.MEMORY}),
    "X1": frozenset(),
    "X2": frozenset({Capability.PACKAGE}),
    "A1": frozenset({Capability.EXECUTE}),
}
"""What a backend must be able to show for a rule's tests to apply to it."""

RULE_CONDITIONS: dict[str, tuple[Capability, str]] = {
    "X1": (
        Capability.PACKAGE,
        "only where lowering rejects the program (the P6-P8 scenarios): a backend without a package is not "
        "held to P6-P8, so it may accept them, and X1 is then not applicable",
    ),
}
"""Rules that apply without a capability but then only case by case (conformance/test_rejection.py): the
capability that makes them apply always, and the condition that holds without it."""

JUDGE_HELD_CONSTANTS = frozenset({"E1", "E3", "E4", "E5", "S1", "S2", "S3", "S4", "S5", "S6", "S7", "A1"})
"""Rules that judge how the backend under test holds a program's constants and state (isolation, sharing,
accuracy): a test of them whose program the backend held none of did not exercise it, and ends "not
exercised" (Spec v6; ``Lowered.ownership``), never passed."""

WAITS_FOR_CLOCK = frozenset({"P9"})
"""Rules whose test lowers again once the zip clock has moved past the case's first package: they run last
in their case, and in a one-worker run after every case (scheduling.workers.later_unit), when that time has
usually passed already."""

TIMING_DEPENDENT = frozenset({"S7"})
"""Rules whose verdict depends on thread timing (S7 loads from several threads at once): a race may show in
one run and not the next, so a baseline lists their failures as intermittent (expectations_update)."""


def rules_shown(backend: type[Backend]) -> dict[str, str]:
    """The rules a backend class can show, in spec order, each with the condition its tests apply under
    ("" when they always do): what a run can report for it, short of scenarios it cannot express."""
    shown = {}
    for rule in RULES:
        if RULE_NEEDS[rule] <= backend.capabilities:
            condition = RULE_CONDITIONS.get(rule)
            shown[rule] = condition[1] if condition and condition[0] not in backend.capabilities else ""
    return shown
