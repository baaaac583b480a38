"""Evidence from a lowered program's own memory plan (``Lowered.shared_memory``): a method's state planned
where a method that ran before it keeps tensors reads what that method left there (``shared-arena:state``).
Plain values in, mechanisms out, so the scenario tests, the fuzz and check_program ask it alike."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from pytest_ptn.mechanisms import Kind, Mechanism, Role


def planned_together(
    shared: Mapping[str, Mapping[str, set[str]]],
    methods: Sequence[str],
    wrong: Iterable[tuple[int, Callable[[str], bool]]],
) -> dict[int, tuple[Mechanism, ...]]:
    """For each wrong value (``wrong``: its call, and whether a state key may be what it read), the states
    of the call's method (``methods``: each call's method) whose planned memory a method that ran before the
    call also uses (``shared``: method -> state key -> the other methods whose tensors use that memory)."""
    out: dict[int, tuple[Mechanism, ...]] = {}
    for call, reads in wrong:
        method = methods[call]
        before = set(methods[:call]) - {method}
        found = tuple(
            Mechanism(
                Kind.SHARED_ARENA,
                Role.STATE,
                f"the memory plan puts {key!r} of {method}() where {', '.join(sorted(ran))}() also keep "
                "tensors",
            )
            for key, users in sorted(shared.get(method, {}).items())
            if (ran := users & before) and reads(key)
        )
        if found:
            out[call] = found
    return out
