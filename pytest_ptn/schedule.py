"""When each method of a loaded program is loaded, relative to the calls: the load schedules runners use.

A backend can be right when every method is loaded before the first call and wrong when a method is loaded
after another has run (a late ``load_method`` re-initializing shared state), which is what
``executorch.extension.module.Module`` does: it loads a method when it is first executed. Every E rule must
hold under both.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence


class LoadSchedule(enum.Enum):
    UP_FRONT = "up_front"
    """Every method loaded before the first call."""
    AT_FIRST_CALL = "at_first_call"
    """Each method loaded right before its first call, after the calls before it ran."""

    def loads(self, methods: Sequence[str], sequence: Sequence[str]) -> list[list[str]]:
        """For each call of ``sequence``, the methods to load just before it."""
        if self is LoadSchedule.UP_FRONT:
            return [list(methods), *([] for _ in sequence[1:])] if sequence else []
        seen: set[str] = set()
        out = []
        for method in sequence:
            out.append([] if method in seen else [method])
            seen.add(method)
        return out

    def describe(self, sequence: Sequence[str]) -> str:
        """The schedule as a failure names it: "methods loaded at their first call: decode loaded after
        prefill ran"."""
        if self is LoadSchedule.UP_FRONT:
            return "every method loaded before the first call"
        late = []
        for i, method in enumerate(sequence):
            ran = list(dict.fromkeys(m for m in sequence[:i] if m != method))
            if method not in sequence[:i] and ran:
                late.append(f"{method} loaded after {', '.join(ran)} ran")
        return "methods loaded at their first call" + (f": {'; '.join(late)}" if late else "")
