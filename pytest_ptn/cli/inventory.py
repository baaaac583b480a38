"""What this installation offers (backends, scenarios, rules) for ``python -m pytest_ptn list``.

An installed backend is asked only for its ``availability()``, which imports neither torch nor executorch;
the ``ext:`` flows are ExecuTorch's own registry, which only importing executorch's test suite can list.
``list backends``, which imports executorch for them anyway, also has each available backend load its
runtime (``Backend.load_runtime``), where a run would stop before its first test. Whatever one of them
raises, it is listed as unavailable with what it raised, and the others are listed all the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_ptn.backend import (
    EXT_PREFIX,
    Availability,
    Backend,
    BackendError,
    Capability,
    availability_of,
    installed_backends,
    one_line,
    resolve_backend,
    runtime_availability,
)
from pytest_ptn.backends import ext
from pytest_ptn.programs import catalogue, zoo
from pytest_ptn.ruleset import RULE_CONDITIONS, RULE_NEEDS, RULES, rules_shown

CONDITIONAL_MARK = "?"
"""Follows a rule id whose tests apply to a backend only case by case (``X1?``)."""


@dataclass(frozen=True)
class BackendInfo:
    name: str
    available: bool
    reason: str
    versions: dict[str, str]
    capabilities: list[str]
    rules: dict[str, str]
    """Rule id -> the condition its tests apply under on this backend, "" when they always do."""


@dataclass(frozen=True)
class ScenarioInfo:
    name: str
    tags: list[str]
    description: str


@dataclass(frozen=True)
class RuleInfo:
    id: str
    level: str
    title: str
    needs: list[str]
    condition: str
    """When the rule applies without a capability only case by case: which, and the case; else ""."""


def backends(load_runtimes: bool = False) -> list[BackendInfo]:
    """Every installed backend; one that cannot even be imported is listed as unavailable, with why. With
    ``load_runtimes``, also one whose runtime does not load (that imports torch and executorch)."""
    infos = []
    for name in sorted(installed_backends()):
        try:
            cls = resolve_backend(name)
            availability = availability_of(name, cls)
            if load_runtimes:
                availability = runtime_availability(cls, availability)
        except BackendError as e:
            infos.append(BackendInfo(name, False, f"cannot load the backend: {e}", {}, [], {}))
            continue
        infos.append(_info(name, cls, availability))
    return infos


def ext_flows() -> list[BackendInfo]:
    """Every flow of ExecuTorch's backend test suite as ``ext:<flow>``, with availability, and each group of
    flows the registry left out (``ext:qnn*``) with why."""
    try:
        listed = ext.listing()
    except Exception as e:  # importing executorch's test suite failed: its runtime, a toolchain
        return [
            BackendInfo(f"{EXT_PREFIX}*", False, f"cannot read the flow registry: {one_line(e)}", {}, [], {})
        ]
    infos = []
    for name, cls, why_not in listed:
        if cls is None:
            infos.append(BackendInfo(name, False, why_not, {}, [], {}))
            continue
        try:
            infos.append(_info(name, cls, availability_of(name, cls)))
        except BackendError as e:
            infos.append(BackendInfo(name, False, str(e), {}, _capability_names(cls.capabilities), {}))
    return infos


def all_backends() -> list[BackendInfo]:
    """The installed backends, their runtimes loaded, then the ext: flows."""
    return backends(load_runtimes=True) + ext_flows()


def scenarios() -> list[ScenarioInfo]:
    """The catalogue's scenarios, then the zoo's (listed without building them)."""
    listed = [ScenarioInfo(s.name, sorted(s.tags), s.doc) for s in catalogue.SCENARIOS]
    return listed + [ScenarioInfo(m.name, sorted(m.tags), m.doc) for m in zoo.MODELS]


def rules() -> list[RuleInfo]:
    infos = []
    for rule in RULES.values():
        condition = RULE_CONDITIONS.get(rule.id)
        note = f"without {condition[0].value}, {condition[1]}" if condition else ""
        infos.append(RuleInfo(rule.id, rule.level, rule.title, _capability_names(RULE_NEEDS[rule.id]), note))
    return infos


def summarize_rules(shown: dict[str, str]) -> str:
    """A family letter where every rule of the family always applies, else the rule ids that apply, the
    conditional ones marked: ``P E S X``, ``E S6 X1?``. The README's backends table uses this notation."""
    words: list[str] = []
    for family in dict.fromkeys(rule.family for rule in RULES.values()):
        ids = [r for r, rule in RULES.items() if rule.family == family]
        if all(shown.get(r) == "" for r in ids):
            words.append(family)
        else:
            words += [r + (CONDITIONAL_MARK if shown[r] else "") for r in ids if r in shown]
    return " ".join(words) or "none"


def render_backends(infos: list[BackendInfo]) -> list[str]:
    rows = [
        [
            b.name,
            "yes" if b.available else "no",
            ", ".join(b.capabilities) or "-",
            summarize_rules(b.rules),
            "; ".join(filter(None, [", ".join(f"{d} {v}" for d, v in b.versions.items()), b.reason])),
        ]
        for b in infos
    ]
    lines = _table(["backend", "available", "capabilities", "rules", "versions / why not"], rows)
    conditions = {r: c for b in infos for r, c in b.rules.items() if c}
    return lines + [f"{r}{CONDITIONAL_MARK}: applies {c}" for r, c in conditions.items()]


def render_scenarios(infos: list[ScenarioInfo]) -> list[str]:
    return _table(
        ["scenario", "tags", "description"], [[s.name, ", ".join(s.tags), s.description] for s in infos]
    )


def render_rules(infos: list[RuleInfo]) -> list[str]:
    rows = [[r.id, r.level, r.title, ", ".join(r.needs) or "-", r.condition] for r in infos]
    return _table(["rule", "level", "title", "needs", "note"], rows)


def _info(name: str, cls: type[Backend], availability: Availability) -> BackendInfo:
    return BackendInfo(
        name,
        availability.available,
        availability.reason,
        dict(availability.versions),
        _capability_names(cls.capabilities),
        rules_shown(cls),
    )


def _capability_names(capabilities: frozenset[Capability]) -> list[str]:
    return [c.value for c in Capability if c in capabilities]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell, the last one left ragged."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    return [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in [header, *rows]
    ]
