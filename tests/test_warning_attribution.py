"""An upstream warning is counted under the package whose code raised it, also when its stack level points
into the standard library (a deprecated class re-created by ``copyreg`` while a program is copied) or into
the harness that called a backend (an adapter's deprecation that blames its caller)."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from types import SimpleNamespace

from typing_extensions import deprecated

from pytest_ptn import upstream_noise
from pytest_ptn.backends.pte_runtime import RuntimeLoaded


class Deprecated:
    def __new__(cls) -> Deprecated:
        warnings.warn("Deprecated is deprecated", FutureWarning, stacklevel=2)  # the caller: copyreg
        return super().__new__(cls)

    def __reduce_ex__(self, protocol: object) -> tuple[object, ...]:
        return (Deprecated, ())


@deprecated("Wrapped is deprecated", category=FutureWarning)
class Wrapped:
    """Deprecated as torch deprecates its classes: the decorator's ``__new__`` warns for it."""

    def __reduce_ex__(self, protocol: object) -> tuple[object, ...]:
        return (Wrapped, ())


def test_a_warning_a_stdlib_frame_is_blamed_for_counts_under_its_caller() -> None:
    tally = upstream_noise.Tally()
    with upstream_noise.contained(tally):
        copy.deepcopy(Deprecated.__new__(Deprecated))  # deepcopy -> copyreg -> Deprecated.__new__
        copy.deepcopy(Wrapped.__new__(Wrapped))  # the decorator's __new__ warns, blaming copy
        warnings.warn("plain", UserWarning, stacklevel=1)
    assert tally.rows() == [("FutureWarning", __name__, 4), ("UserWarning", __name__, 1)]


class Adapter:
    """A runtime's program whose ``run`` is deprecated, as a library deprecates: blaming its caller, which is
    pytest-ptn's RuntimeLoaded."""

    def run(self, method: str, inputs: list[object]) -> list[object]:
        warnings.warn("run() is deprecated", DeprecationWarning, stacklevel=2)
        return []


RUN_LINE = Adapter.run.__code__.co_firstlineno + 1


def test_a_warning_blaming_the_harness_is_the_adapters() -> None:
    loaded = RuntimeLoaded(Adapter(), SimpleNamespace(methods={"m": SimpleNamespace(input_mutations={})}))
    tally = upstream_noise.Tally()
    with upstream_noise.contained(tally):
        loaded.run("m", [])
    assert tally.rows() == [("DeprecationWarning", __name__, 1)]
    with warnings.catch_warnings(record=True) as seen, upstream_noise.shown():
        warnings.simplefilter("always")
        loaded.run("m", [])
    assert [(Path(w.filename), w.lineno) for w in seen] == [(Path(__file__), RUN_LINE)]
