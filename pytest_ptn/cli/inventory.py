"""What this installation offers (backends, scenarios, rules) for ``python -m pytest_ptn list``.

An installed backend is asked only for its ``availability()``, which imports neither torch nor executorch;
the ``ext:`` flows are ExecuTorch's own registry, which only importing executorch's test suite can list.
``list backends``, which imports executorch for them anyway, also has each available backend load its
runtime (``Backend.load_runtime``), where a run would stop before its first test. Whatever one of them
raises, it is listed as unavailable with what it raised, and the others are listed all the same. The flows
are asked in worker processes, as many at once as the machine has cores: the first listing in an
environment lowers a program through each flow whose delegate this runtime lacks (pytest_ptn.backends.ext).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

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
from pytest_ptn.backends import ext, probe_cache
from pytest_ptn.cli.progress import QUIET, Status
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


def backends(load_runtimes: bool = False, status: Status = QUIET) -> list[BackendInfo]:
    """Every installed backend; one that cannot even be imported is listed as unavailable, with why. With
    ``load_runtimes``, also one whose runtime does not load (that imports torch and executorch)."""
    infos = []
    names = sorted(installed_backends())
    for i, name in enumerate(names):
        if load_runtimes:
            status.update(f"list backends: loading the runtime of {name} ({i + 1}/{len(names)})")
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


def ext_flows(status: Status = QUIET) -> list[BackendInfo]:
    """Every flow of ExecuTorch's backend test suite as ``ext:<flow>``, with availability, and each group of
    flows the registry left out (``ext:qnn*``) with why."""
    status.update("list backends: reading the flow registry of ExecuTorch's backend test suite")
    try:
        listed = ext.listing()
    except Exception as e:  # importing executorch's test suite failed: its runtime, a toolchain
        return [
            BackendInfo(f"{EXT_PREFIX}*", False, f"cannot read the flow registry: {one_line(e)}", {}, [], {})
        ]
    found = flow_availabilities([cls.flow_name for _, cls, _ in listed if cls is not None], status)
    infos = []
    for name, cls, why_not in listed:
        if cls is None:
            infos.append(BackendInfo(name, False, why_not, {}, [], {}))
            continue
        availability = found[cls.flow_name]
        if isinstance(availability, str):
            infos.append(BackendInfo(name, False, availability, {}, _capability_names(cls.capabilities), {}))
        else:
            infos.append(_info(name, cls, availability))
    return infos


def flow_availabilities(flows: list[str], status: Status = QUIET) -> dict[str, Availability | str]:
    """Each flow's availability, or why asking for it failed. Asked in worker processes, as many at once as
    the machine has cores; on Linux forked, so that each starts with the registry this process imported."""
    if not flows:
        return {}
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    events = context.SimpleQueue()
    found: dict[str, Availability | str] = {}
    doing: dict[str, str] = {}
    workers = min(os.cpu_count() or 1, len(flows))
    kept = f"once per environment: kept in {probe_cache.cache_dir()}"
    with ProcessPoolExecutor(workers, context, initializer=_tell, initargs=(events,)) as pool:
        pending: dict[Future[Availability | str], str] = {}
        for flow in flows:
            pending[pool.submit(_flow_availability, flow)] = flow
        while pending:
            done, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for future in done:
                flow = pending.pop(future)
                doing.pop(flow, None)
                try:
                    found[flow] = future.result()
                except BrokenProcessPool as e:  # a worker died (a toolchain that crashes its process)
                    found[flow] = f"asking whether it runs here ended the process that asked: {e}"
            while not events.empty():
                step, flow = events.get()
                if flow not in found:
                    doing[flow] = step
                if step == PROBING:
                    status.note(f"list backends: probing {EXT_PREFIX}{flow} ({kept})")
            status.update(_progress_line(len(found), len(flows), doing))
    return found


CHECKING, PROBING = "checking", "probing"
"""What a worker tells of the flow it works on: its availability is asked, or a slow probe of it runs."""

_events: Any = None
"""In a worker process: the queue on which it tells what it is doing (``_tell``)."""


def _tell(events: Any) -> None:
    global _events
    _events = events


def _flow_availability(flow: str) -> Availability | str:
    """In a worker process: ``flow``'s availability, or why asking for it failed."""
    _events.put((CHECKING, flow))
    cls = ext.flow_backend(flow)
    with probe_cache.announced(lambda _: _events.put((PROBING, flow))):
        try:
            return availability_of(cls.name, cls)
        except BackendError as e:
            return str(e)


def _progress_line(done: int, total: int, doing: dict[str, str]) -> str:
    """``list backends: 3/10 ext: flows; probing ext:coreml_static_int8; checking ext:vulkan``"""
    parts = [f"list backends: {done}/{total} {EXT_PREFIX} flows"]
    for step in (PROBING, CHECKING):
        names = [f"{EXT_PREFIX}{flow}" for flow, s in doing.items() if s == step]
        if names:
            parts.append(f"{step} {', '.join(names)}")
    return "; ".join(parts)


def all_backends(status: Status = QUIET) -> list[BackendInfo]:
    """The installed backends, their runtimes loaded, then the ext: flows."""
    return backends(load_runtimes=True, status=status) + ext_flows(status)


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
