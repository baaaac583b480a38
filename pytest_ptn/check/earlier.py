"""What programs loaded earlier in this process held under each name, and the replay of a program bound to
those tensors: a loader whose cache outlives its program and is keyed by name (S4; the CUDA delegate's
process-wide constant cache, executorch#21823) hands a later program an earlier one's tensors. No replay of
the program alone can give that, so without this record the fuzz, which loads hundreds of programs through
one backend, names such a bug by whatever else happens to fit (a lookalike, an error's message)."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
from torch.export import ExportedProgram

from pytest_ptn.check.execution import Call, flat
from pytest_ptn.check.explain import Replay, plain
from pytest_ptn.instruments.content import same_content
from pytest_ptn.mechanisms import Kind, Mechanism, Role
from pytest_ptn.programs.exported import constants_of, mutable_keys
from pytest_ptn.programs.source import exported_eager, set_tensor


class EarlierPrograms:
    """The first tensor each name held among the programs ``add``-ed (in the order they loaded): by method
    and key (a cache keyed by the name a package gives, ``method/key``), and by key alone (one keyed by the
    name the method's graph gives). A cache keeps the first tensor it saw under a name. And the kinds of
    mechanism those programs showed (``shown``): what breaks a tie between two kinds that one program
    cannot tell apart."""

    def __init__(self) -> None:
        self.by_method_and_key: dict[tuple[str, str], torch.Tensor] = {}
        self.by_key: dict[str, torch.Tensor] = {}
        self.shown: Counter[Kind] = Counter()
        self._pending: list[Callable[[], dict[str, ExportedProgram]]] = []

    def showed(self, found: Iterable[Mechanism]) -> None:
        """Count the kinds a program showed, each once."""
        self.shown.update({m.kind for m in found})

    def add(self, exports: Callable[[], dict[str, ExportedProgram]]) -> None:
        """Record a program the backend loaded: ``exports`` makes its exports, read only when a later
        program needs the record (most never do), and its state, which no cache by name keeps, is left out."""
        self._pending.append(exports)

    def _recorded(self) -> None:
        for exports in self._pending:
            programs = exports()
            mutable = mutable_keys(programs)
            for method, ep in programs.items():
                for key, use in constants_of(ep).items():
                    if key in mutable or not plain(use.tensor):
                        continue
                    t = use.tensor.detach().clone()
                    self.by_method_and_key.setdefault((method, key), t)
                    self.by_key.setdefault(key, t)
        self._pending.clear()

    def replays(
        self, programs: Mapping[str, ExportedProgram], mutable: set[str], sequence: Sequence[Call]
    ) -> list[Replay]:
        """What ``programs`` give on ``sequence`` (or raise) with each immutable tensor bound to the one an
        earlier program first held under the same method and key, then under the same key: one replay each
        where some name held other content, none where none did (or where both bind alike)."""
        self._recorded()
        out: list[Replay] = []
        seen: list[dict[tuple[str, str], torch.Tensor]] = []
        constants = {method: constants_of(ep) for method, ep in programs.items()}
        for scope, of in (
            ("under the same method and name", lambda method, key: self.by_method_and_key.get((method, key))),
            ("under the same name", lambda method, key: self.by_key.get(key)),
        ):
            bound: dict[tuple[str, str], torch.Tensor] = {}
            roles: dict[tuple[str, str], Role] = {}
            for method, ep in programs.items():
                buffers = set(ep.graph_signature.buffers)
                for key, use in constants[method].items():
                    theirs = of(method, key)
                    if key in mutable or use.mutable or theirs is None or not plain(use.tensor):
                        continue
                    if not same_content(theirs, use.tensor):
                        bound[(method, key)] = theirs
                        roles[(method, key)] = Role.BUFFER if key in buffers else Role.CONSTANT
            if not bound or any(_same_binding(bound, s) for s in seen):
                continue
            seen.append(bound)
            out.append(_replay(programs, mutable, sequence, bound, roles, scope))
        return out


def _same_binding(
    a: Mapping[tuple[str, str], torch.Tensor], b: Mapping[tuple[str, str], torch.Tensor]
) -> bool:
    return a.keys() == b.keys() and all(same_content(a[k], b[k]) for k in a)


def _replay(
    programs: Mapping[str, ExportedProgram],
    mutable: set[str],
    sequence: Sequence[Call],
    bound: Mapping[tuple[str, str], torch.Tensor],
    roles: Mapping[tuple[str, str], Role],
    scope: str,
) -> Replay:
    modules = exported_eager(programs, mutable)
    for (method, key), t in bound.items():
        set_tensor(modules[method], key, t.clone())
    how = tuple(
        Mechanism(
            Kind.BY_NAME,
            role,
            "the first tensor this process loaded "
            + scope
            + " for "
            + ", ".join(f"method {m!r}'s {k!r}" for (m, k), r in sorted(roles.items()) if r is role),
        )
        for role in sorted(set(roles.values()), key=lambda r: r.value)
    )
    label = f"the first tensors this process loaded {scope}"
    outputs: list[list[torch.Tensor]] = []
    try:
        for name, args in sequence:
            outputs.append(flat(modules[name](*copy.deepcopy(args))))
    except Exception as e:
        return Replay(f"what {label} raise", [], how, e, len(outputs))
    return Replay(f"what {label} give", outputs, how)
