"""The numbered rules of conformance spec v1 as data, so markers, reports and tests share one list."""

from __future__ import annotations

from dataclasses import dataclass

SPEC_VERSION = "1"


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    level: str  # "MUST" or "SHOULD"

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
    )
}
