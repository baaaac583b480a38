"""The faulty-binding replays of one program (check.explain), made once for every test that asks, and those
bound to what earlier programs held (check.earlier): which binding gives a wrong value, or raises what the
backend raised."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from pytest_ptn.backend import EagerCall
    from pytest_ptn.check.earlier import EarlierPrograms
    from pytest_ptn.check.explain import Replay, Replays


class ProgramReplays:
    """The replays of program ``name`` (``export``: fresh exported programs; ``mutable``: the keys some
    method writes), kept in ``made`` (shared by the cases of one run), with ``earlier`` those bound to what
    the process's earlier programs held. ``bindable`` False: a quantized program, which no replay binds
    (programs.quantized says whose constant it read)."""

    def __init__(
        self,
        name: str,
        export: Callable[[], dict[str, ExportedProgram]],
        mutable: Callable[[], set[str]],
        made: dict[tuple[object, ...], Replays],
        earlier: EarlierPrograms | None,
        bindable: bool = True,
    ):
        self.name = name
        self.export = export
        self.mutable = mutable
        self.made = made
        self.earlier = earlier
        self.bindable = bindable
        self._earlier: dict[tuple[object, ...], Replays] = {}

    def of(self, calls: Sequence[EagerCall], earlier: bool = True) -> Replays:
        """The replays of ``calls`` (check.explain.faulty_replays), and unless ``earlier`` is False, those
        bound to what earlier programs held."""
        from pytest_ptn.check.alone import identity
        from pytest_ptn.check.explain import faulty_replays

        if not self.bindable:
            return []
        sequence = [(c.method, c.inputs) for c in calls]
        key = (self.name, *((m, *map(identity, args)) for m, args in sequence))
        if key not in self.made:
            self.made[key] = faulty_replays(self.export(), self.mutable(), sequence)
        if self.earlier is None or not earlier:
            return self.made[key]
        if key not in self._earlier:
            self._earlier[key] = self.earlier.replays(self.export(), self.mutable(), sequence)
        return self.made[key] + self._earlier[key]

    def raising(
        self, error: BaseException, calls: Sequence[EagerCall], at: int | None, names: Sequence[str]
    ) -> Replay | None:
        """The faulty binding that makes the program raise ``error`` at call ``at`` of
        ``calls`` (check.explain.explaining_error; ``names``: the program's method names): the program's own
        replays first, what earlier programs held only where those raise nothing alike or bind by metadata
        alone; a tie goes to the kind earlier programs showed most."""
        from pytest_ptn.check.explain import explaining_error

        shown = self.earlier.shown if self.earlier is not None else None
        replay = explaining_error(self.of(calls, earlier=False), error, at, names, shown)
        if self.earlier is not None and (replay is None or replay.weak):
            replay = explaining_error(self.of(calls), error, at, names, shown)
        return replay
