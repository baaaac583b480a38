"""What a program holds that the rules are about, so a clean check can be read for what it covered.

A program exported method by method meets the rules through four things: a constant name minted in several
methods with different bytes (P1, S2, S3 bite there), one tensor held in several places by identity or
equal bytes in several (S1, P4), a buffer bound by several methods (E3, P2), and methods a runner loads
lazily, after others ran (E1, E3, E4 under the first-call load schedule). A program without one of them is
checked all the same, and its verdict on those rules is true but says nothing about that hazard:
``Hazards`` names the rules that had no case of it to check ("no constant name appears in two methods: P1,
S2, S3 had no collision to check"). Constant methods (values, no program) are named too: no rule applies
to them.

Real programs often lack the first: optimum-executorch's exports hold parameters and buffers only, each
name in one method, so a clean check of them says nothing about P1, S2 and S3.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch.export import ExportedProgram

from pytest_ptn.instruments.content import digest
from pytest_ptn.programs.exported import constants_of, mutable_keys
from pytest_ptn.ruleset import RULES

Place = tuple[str, str]
"""(method, key) of a constant."""


def _rules(*ids: str) -> tuple[str, ...]:
    return tuple(RULES[i].id for i in ids)  # KeyError at import if the rule set drops one


@dataclass(frozen=True)
class Family:
    """A kind of hazard: the rules that bite on it, and what one case of it is called."""

    rules: tuple[str, ...]
    case: str


COLLISION = Family(_rules("P1", "S2", "S3"), "collision")
"""A name holding different bytes in two methods: namespacing, never sharing by name."""
SHARING = Family(_rules("S1", "P4"), "duplicate")
"""One tensor, or equal bytes, in several places: sharing it, storing it once."""
SHARED_STATE = Family(_rules("E3", "P2"), "shared state")
"""A buffer bound by several methods: one state, seen by every method."""
LATE_LOAD = Family(_rules("E1", "E3", "E4"), "late load")
"""A method loaded after others ran: the first-call load schedule (a late load that re-initializes shared
state, as ``pte-shared-state`` does)."""


@dataclass(frozen=True)
class Hazards:
    """The program's hazards, each family empty where the program has none of it."""

    collisions: dict[str, tuple[str, ...]]
    """Constant name -> the methods holding it, where their bytes differ."""
    shared_names: tuple[str, ...]
    """Constant names held by several methods with the same bytes."""
    shared: tuple[tuple[Place, ...], ...]
    """Places holding one tensor (the same storage): a tied weight, a module reachable by two paths."""
    equal: tuple[tuple[Place, ...], ...]
    """Places holding separate tensors with equal bytes, in more than one method."""
    shared_state: dict[str, tuple[str, ...]]
    """Mutated buffer -> the methods binding it, where more than one does."""
    writers: dict[str, tuple[str, ...]]
    """Mutated buffer -> the methods writing it."""
    late_loads: dict[str, tuple[str, ...]]
    """Method -> the methods that ran before its first call (loaded then, as a runner that loads a method
    at its first call does)."""
    constant_methods: tuple[str, ...]
    """Methods that return a constant (optimum's ``get_max_seq_len``): named, never lowered or checked."""

    @property
    def unchecked(self) -> dict[str, Family]:
        """Each absent family's one-line statement -> the family, whose rules therefore had no case of it to
        check (a rule may still check the program's structure: P1 that every key is namespaced)."""
        out: dict[str, Family] = {}
        if not self.collisions:
            some = "holds different bytes in two methods" if self.shared_names else "appears in two methods"
            out[f"no constant name {some}"] = COLLISION
        if not self.shared and not self.equal:
            out["no tensor is held in two places, by identity or equal bytes"] = SHARING
        if not self.shared_state:
            out["no buffer is bound by two methods"] = SHARED_STATE
        if not self.late_loads:
            out["no method is loaded after another ran"] = LATE_LOAD
        return out

    @property
    def unchecked_rules(self) -> tuple[str, ...]:
        """The rules no hazard of the program exercises, in spec order."""
        found = {r for family in self.unchecked.values() for r in family.rules}
        return tuple(r for r in RULES if r in found)

    def lines(self) -> list[str]:
        """What the program holds, one family a line (the first few of each), then what it does not hold
        and which rules that leaves with no case to check."""
        lines = []
        if self.collisions:
            names = _listed([f"{k!r} ({', '.join(ms)})" for k, ms in self.collisions.items()])
            lines.append(f"names minted in several methods with different bytes: {names}")
        if self.shared:
            lines.append(f"tensors shared by identity: {_listed([_places(g) for g in self.shared])}")
        if self.equal:
            lines.append(f"equal bytes in separate tensors: {_listed([_places(g) for g in self.equal])}")
        if self.shared_state:
            said = _listed(
                [
                    f"{k!r} ({', '.join(ms)}; written by {', '.join(self.writers[k])})"
                    for k, ms in self.shared_state.items()
                ]
            )
            lines.append(f"state shared across methods: {said}")
        if self.late_loads:
            said = "; ".join(f"{m} after {', '.join(ran)} ran" for m, ran in self.late_loads.items())
            lines.append(f"methods loaded lazily, at their first call: {said}")
        if self.constant_methods:
            lines.append(
                f"constant methods (values, no program: no rule applies, calls to them are not run): "
                f"{', '.join(self.constant_methods)}"
            )
        lines += [
            f"{said}: {', '.join(family.rules)} had no {family.case} to check"
            for said, family in self.unchecked.items()
        ]
        return lines

    def __str__(self) -> str:
        return "\n".join(self.lines())


def hazards_of(
    programs: Mapping[str, ExportedProgram], sequence: Sequence[str], constant_methods: Sequence[str] = ()
) -> Hazards:
    """The hazards of ``programs`` (method -> functionalized program, so that mutations are in the
    signature), called in the order ``sequence`` names them."""
    mutable = mutable_keys(dict(programs))
    by_key: dict[str, dict[str, tuple[str, str]]] = {}  # immutable key -> method -> content
    by_storage: dict[tuple[object, ...], list[Place]] = {}
    by_content: dict[tuple[str, str], list[Place]] = {}
    binders: dict[str, list[str]] = {}
    writers: dict[str, list[str]] = {}
    for method, ep in programs.items():
        for key, use in constants_of(ep).items():
            t = use.tensor
            if key in mutable:
                binders.setdefault(key, []).append(method)
                if use.mutable:
                    writers.setdefault(key, []).append(method)
                continue
            content = (f"{t.dtype}{tuple(t.shape)}", digest(t))
            by_key.setdefault(key, {})[method] = content
            storage = t.untyped_storage().data_ptr()
            identity = (storage, t.storage_offset(), t.dtype, tuple(t.shape), t.stride())
            by_storage.setdefault(identity, []).append((method, key))
            by_content.setdefault(content, []).append((method, key))
    shared = tuple(tuple(places) for places in by_storage.values() if len(places) > 1)
    in_shared = {p for places in shared for p in places}
    equal = tuple(
        tuple(places)
        for places in by_content.values()
        if len({m for m, _ in places}) > 1 and not set(places) <= in_shared
    )
    return Hazards(
        collisions={k: tuple(ms) for k, ms in by_key.items() if len(set(ms.values())) > 1},
        shared_names=tuple(k for k, ms in by_key.items() if len(ms) > 1 and len(set(ms.values())) == 1),
        shared=shared,
        equal=equal,
        shared_state={k: tuple(ms) for k, ms in binders.items() if len(ms) > 1},
        writers={k: tuple(ms) for k, ms in writers.items()},
        late_loads=_late_loads(sequence),
        constant_methods=tuple(constant_methods),
    )


def _late_loads(sequence: Sequence[str]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for i, method in enumerate(sequence):
        ran = tuple(dict.fromkeys(m for m in sequence[:i] if m != method))
        if method not in sequence[:i] and ran:
            out[method] = ran
    return out


SHOWN = 3
"""How many entries of a family (and places of a group) a line names before counting the rest."""


def _listed(items: list[str]) -> str:
    more = f"; and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return "; ".join(items[:SHOWN]) + more


def _places(places: tuple[Place, ...]) -> str:
    more = f" (and {len(places) - SHOWN} more places)" if len(places) > SHOWN else ""
    return " = ".join(f"{m}:{k}" for m, k in places[:SHOWN]) + more
