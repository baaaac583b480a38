"""Say whose data a wrong output read, or what made a run raise: replay the program with one constant or
buffer bound the way a faulty loader binds it (or two such faults at once), and see whether that gives the
backend's values, or the backend's error: the replay that does names the mechanisms (pytest_ptn.mechanisms).
A loader that binds another method's tensor of another dtype raises in the method's graph just as the
replay binding it does, so one bug is one mechanism whether it shows as a value or an error."""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import torch

from pytest_ptn.check.execution import Call, flat
from pytest_ptn.check.findings import Difference
from pytest_ptn.instruments.content import digest, same_content, tensor_bytes
from pytest_ptn.mechanisms import TRAITS, Kind, Mechanism, Role, stated, without_names
from pytest_ptn.programs.exported import constants_of
from pytest_ptn.programs.source import exported_eager, find_tensor, set_tensor
from pytest_ptn.programs.survey import looks_alike
from pytest_ptn.reference.planner import ConstantUse
from pytest_ptn.schedule import LoadSchedule

Modules = dict[str, torch.nn.Module]


class Replay(NamedTuple):
    """What one faulty binding (or two at once) gives on every call of a sequence, or what it raised."""

    label: str
    """What it is: "what method 'prefill''s 'weight' would give"."""
    outputs: list[list[torch.Tensor]]
    """Every call's outputs; none where the replay raised."""
    mechanisms: tuple[Mechanism, ...]
    error: Exception | None = None
    """What the program raised when bound this way."""
    raised_at: int | None = None
    """The call that raised it."""
    schedule: LoadSchedule | None = None
    """The load schedule the replay models (a fault of loading itself); None: what any schedule gives."""
    weak: bool = False
    """Whether the binding is the evidence of last resort: a tensor that shares only dtype and shape with
    the method's own (``same_metadata``), which names a value only where no other replay gives it too."""


Replays = list[Replay]


def explanations(
    replays: Replays,
    returned: Sequence[Sequence[torch.Tensor]],
    wrong: Mapping[int, str],
    schedule: LoadSchedule | None = None,
    late_only: Collection[int] = (),
    eager: Sequence[Sequence[torch.Tensor]] | None = None,
    shown: Mapping[Kind, int] | None = None,
) -> dict[int, tuple[Replay, ...]]:
    """For each wrong call (``wrong``: call -> its method) whose outputs, ``returned`` by the backend with
    its methods loaded as ``schedule`` says, faulty bindings account for: the replays that give them. With
    ``eager``'s outputs, each wrong element of a call may be another replay's (a loader that zero-fills two
    constants, each replay zero-filling one); without, a replay gives the whole call. The replay that
    accounts for most of what is wrong names all of it, then the one that accounts for most of the rest:
    one bug that shows on several calls is one mechanism, not the first of several that each fit some
    call. A replay of a fault of loading (``Replay.schedule``) accounts only for the calls of ``late_only``,
    whose values loading every method up front does not give, and is taken first where it accounts for as
    much as another; then the one of a kind the process's earlier programs showed most (``shown``: one bug
    shows as one kind in every program, and one program cannot always tell two kinds apart); a weak one
    (``Replay.weak``) last; otherwise single faults come before pairs."""
    items = {call: _wrong_elements(call, returned[call], eager[call] if eager else None) for call in wrong}
    items = {call: wanted for call, wanted in items.items() if wanted}
    fits: list[tuple[Replay, set[tuple[int, int, int]]]] = []
    for replay in replays:
        if replay.error is not None or replay.schedule not in (None, schedule):
            continue
        candidates = [c for c in wrong if c in late_only] if replay.schedule else list(wrong)
        given = {item for c in candidates for item in _given(returned[c], replay.outputs[c], items[c])}
        if given:
            fits.append((replay, given))
    chosen: dict[tuple[int, int, int], Replay] = {}
    while fits:
        replay, given = max(
            fits,
            key=lambda fit: (
                len(fit[1]),
                fit[0].schedule is not None,
                _shown(fit[0], shown),
                not fit[0].weak,
            ),
        )
        chosen |= dict.fromkeys(given, replay)
        fits = [(r, rest) for r, g in fits if (rest := g - given)]
    return {
        call: tuple({id(r): r for r in (chosen[item] for item in sorted(wanted))}.values())
        for call, wanted in items.items()
        if wanted <= chosen.keys()
    }


def _shown(replay: Replay, shown: Mapping[Kind, int] | None) -> int:
    """How many of the process's earlier programs showed the kind of ``replay``'s mechanisms."""
    return max((shown.get(m.kind, 0) for m in replay.mechanisms), default=0) if shown else 0


def _wrong_elements(
    call: int, have: Sequence[torch.Tensor], want: Sequence[torch.Tensor] | None
) -> set[tuple[int, int, int]]:
    """The elements (call, output, flat index) of ``call``'s outputs ``have`` that differ from eager's
    (``want``), or one item for the whole call (call, -1, -1) where eager's are not given or not of the
    same shapes."""
    from pytest_ptn.instruments.comparison import close

    if want is None or [h.shape for h in have] != [w.shape for w in want]:
        return {(call, -1, -1)}
    return {
        (call, output, int(i))
        for output, (h, w) in enumerate(zip(have, want, strict=True))
        for i in (~close(h, w)).reshape(-1).nonzero().reshape(-1).tolist()
    }


def _given(
    have: Sequence[torch.Tensor], replayed: Sequence[torch.Tensor], wanted: set[tuple[int, int, int]]
) -> set[tuple[int, int, int]]:
    """The items of ``wanted`` (a call's ``_wrong_elements``) whose values the replay gives as the backend
    did: the whole call, or element by element."""
    from pytest_ptn.instruments.comparison import close

    call, first, _ = next(iter(wanted))
    if first == -1:  # the whole call
        return wanted if _same(list(have), list(replayed)) else set()
    if [h.shape for h in have] != [r.shape for r in replayed]:
        return set()
    given = {
        (call, output, int(i))
        for output, (h, r) in enumerate(zip(have, replayed, strict=True))
        for i in close(h, r).reshape(-1).nonzero().reshape(-1).tolist()
    }
    return given & wanted


def label_of(replays: Sequence[Replay]) -> str:
    """What ``replays`` give, in words: "what method 'prefill''s 'w' would give and what ..."."""
    return " and ".join(r.label for r in replays)


def mechanisms_of(replays: Sequence[Replay]) -> tuple[Mechanism, ...]:
    """The mechanisms of ``replays``, each once."""
    return tuple(dict.fromkeys(m for r in replays for m in r.mechanisms))


def explaining_error(
    replays: Replays,
    error: BaseException,
    call: int | None,
    names: Iterable[str] = (),
    shown: Mapping[Kind, int] | None = None,
) -> Replay | None:
    """The first replay that raises what the backend raised while running (``error``: its type and its
    message's first line) at the same call (``call``; None: where it raised is not
    known), single faults before pairs and a weak one (``Replay.weak``) last: the binding that makes the
    program fail as the backend does. The same is the same type and message but for what varies between
    programs (``names``: the program's method names), the whole message or the part a backend's own
    wrapping quotes (native's "node 'mul' failed: RuntimeError: ..."); where several raise the same, the
    one of a kind the process's earlier programs showed most (``shown``)."""
    raising = [
        (r, stated(r.error))
        for r in replays
        if r.error is not None and str(r.error).strip() and call in (None, r.raised_at) and r.schedule is None
    ]
    raising.sort(key=lambda pair: pair[0].weak)  # a weak binding only where no other raises the same
    # the binding that raises the very message first (it names the tensors as the backend did), then one
    # that raises it but for what varies
    for same in (lambda said: said, lambda said: without_names(said, names)):
        mine = same(stated(error))
        alike = [r for r, theirs in raising if same(theirs) in mine]
        if alike:  # several bindings may raise one message: the kind the earlier programs showed most
            return max(alike, key=lambda r: _shown(r, shown))
    return None


def faulty_replays(
    fresh: Mapping[str, torch.export.ExportedProgram], mutable: set[str], sequence: Sequence[Call]
) -> Replays:
    """The sequence replayed on the program bound each faulty way a loader binds, one fault at a time, then
    two faults of state at once (state zero-filled that another buffer's writes also reach: the shared
    arena of a .pte whose buffers start from nothing); a binding the program cannot run with keeps what it
    raised, which explains an error only. ``fresh``: new exports (their eager modules are the base every
    binding copies), ``mutable``: the keys of the buffers some method writes. The exports need not be
    functional: a binding reads their constants, and the keys it binds are the eager modules' own."""
    base = exported_eager(fresh, mutable)
    constants = {m: constants_of(ep) for m, ep in fresh.items()}
    buffers = {key for ep in fresh.values() for key in ep.graph_signature.buffers}
    names = [name for name, _ in sequence]
    late_loads = LoadSchedule.AT_FIRST_CALL.loads(list(fresh), names)
    late = {name for i, name in enumerate(names) if i and late_loads[i]}
    # the state in the order a functional program writes it back (its buffers' order)
    order = [key for ep in fresh.values() for key in ep.graph_signature.buffers if key in mutable]
    faults = list(_faults(base, constants, mutable, buffers, set(names), late, list(dict.fromkeys(order))))
    # a start from another state's value pairs with nothing: its replays grow as states squared already
    state_faults = [
        f
        for f in faults
        if f.mechanism.of == Role.STATE and f.on_load is None and f.mechanism.kind != Kind.MISINITIALISED
    ]
    pairs = [
        (first, second)
        for i, first in enumerate(state_faults)
        for second in state_faults[i + 1 :]
        if first.mechanism.kind != second.mechanism.kind
    ]
    out = []
    for chosen in [(f,) for f in faults] + sorted(pairs, key=lambda p: [_binding_order(f) for f in p]):
        modules = copy.deepcopy(base)
        if not all(fault.bind(modules) for fault in sorted(chosen, key=_binding_order)):
            continue
        label = " and ".join(f.label for f in chosen)
        how = tuple(f.mechanism for f in chosen)
        weak = all(f.weak for f in chosen)
        on_load = [f.on_load for f in chosen if f.on_load is not None]
        around = [f.around for f in chosen if f.around is not None]
        schedule = LoadSchedule.AT_FIRST_CALL if on_load else None
        outputs: list[list[torch.Tensor]] = []
        try:
            for i, (name, args) in enumerate(sequence):
                for loading in late_loads[i] if i else ():
                    for hook in on_load:
                        hook(loading, modules)
                after = [hook(modules) for hook in around]
                outputs.append(flat(modules[name](*copy.deepcopy(args))))
                for written in after:
                    written()
        except Exception as e:
            out.append(Replay(f"what {label} raises", [], how, e, len(outputs), schedule, weak))
            continue
        out.append(Replay(f"what {label} would give", outputs, how, schedule=schedule, weak=weak))
    return out


@dataclass(frozen=True)
class _Fault:
    """One faulty binding: its mechanism, its words, and how it binds a copy of the eager modules (False
    when the program has nothing to bind that way)."""

    mechanism: Mechanism
    label: str
    bind: Callable[[Modules], bool]
    on_load: Callable[[str, Modules], None] | None = None
    """What loading a method after others ran does to the bound modules (a fault of loading: its replay
    models the at-first-call schedule)."""
    weak: bool = False
    """A binding of a tensor that shares only dtype and shape with the method's own (Replay.weak)."""
    around: Callable[[Modules], Callable[[], None]] | None = None
    """What the fault does around each call: called before it, it gives what to do after it (a runtime that
    writes state back after a call, each write over the last)."""


def _binding_order(fault: _Fault) -> int:
    """Where ``fault`` binds when a replay binds two at once (mechanisms.Traits.binding_order)."""
    return TRAITS[fault.mechanism.kind].binding_order or 0


def _faults(
    base: Modules,
    constants: Mapping[str, Mapping[str, ConstantUse]],
    mutable: set[str],
    buffers: set[str],
    methods: set[str],
    late: set[str],
    order: Sequence[str] = (),
) -> Iterator[_Fault]:
    """Every faulty binding of the program: another method's same-named constant (of any dtype and shape:
    one the method's graph refuses explains an error), another tensor that looks like the method's own
    under another name (``lookalike``), a private copy of shared state, two buffers in one memory (the
    smaller at the start of the larger), state or a buffer no method writes that starts zero-filled (its
    initial value lost, as a non-persistent buffer's is when a lowering ships no data for it), and so does
    any constant; and state put back to its initial value when a method of ``late`` (loaded at its first
    call, after others ran) loads."""

    def role(key: str) -> Role:
        return Role.STATE if key in mutable else Role.BUFFER if key in buffers else Role.CONSTANT

    for method in sorted(methods):
        for key, use in constants[method].items():
            if key in mutable:
                continue
            for other, theirs in constants.items():
                t = theirs[key].tensor if other != method and key in theirs else None
                if t is not None and plain(t) and plain(use.tensor) and not same_content(t, use.tensor):
                    yield _Fault(
                        Mechanism(
                            Kind.BY_NAME, role(key), f"method {method!r} read method {other!r}'s {key!r}"
                        ),
                        f"method {other!r}'s {key!r}",
                        partial(_bind_other, method, key, t),
                    )
            yield from _same_leaf(method, key, use.tensor, constants, mutable, role)
        yield from _lookalikes(method, constants, mutable, role)
        for key in sorted(mutable & set(constants[method])):
            if any(key in theirs for other, theirs in constants.items() if other != method):
                yield _Fault(
                    Mechanism(Kind.PRIVATE_COPY, Role.STATE, f"method {method!r}'s copy of {key!r}"),
                    f"a private copy of {key!r} (not seeing the other methods' writes)",
                    partial(_bind_private, method, key),
                )
    states = sorted(mutable)
    for i, key in enumerate(states):
        for other in states[i + 1 :]:
            yield _Fault(
                Mechanism(Kind.ONE_MEMORY, Role.STATE, f"{key!r} and {other!r}"),
                f"buffers {key!r} and {other!r} in one memory",
                partial(_bind_one_memory, key, other),
            )
    for i, key in enumerate(order):
        for other in order[i + 1 :]:
            a, b = find_tensor(base, key), find_tensor(base, other)
            if a is not None and b is not None and (a.dtype, a.shape) == (b.dtype, b.shape):
                yield _Fault(
                    Mechanism(Kind.ONE_MEMORY, Role.STATE, f"{key!r} and {other!r}, written back"),
                    f"buffers {key!r} and {other!r} in one memory, each call's writes copied back to it",
                    partial(_bind_initial, other, a.detach().clone()),
                    around=partial(_written_back, key, other),
                )
    yield from _constant_state(base, constants, mutable, role)
    yield from _layouts(base, constants, role)
    held = {key for c in constants.values() for key in c if key not in mutable}
    # every buffer (a non-persistent one ships no data where a lowering treats it as state), then every
    # constant (lowering merged same-named ones; a loader copied data for some dtypes only)
    for key in [*states, *sorted(buffers - mutable), *sorted(held - buffers)]:
        yield _Fault(
            Mechanism(Kind.ZERO_FILLED, role(key), repr(key)),
            f"{key!r} starting zero-filled",
            partial(_bind_zeroed, key),
        )
    initial = {key: t.detach().clone() for key in states if (t := find_tensor(base, key)) is not None}
    for key, value in initial.items():
        for other, other_value in initial.items():
            start = _started_from(value, other_value) if other != key else None
            if start is not None:
                yield _Fault(
                    Mechanism(Kind.MISINITIALISED, Role.STATE, f"{key!r} from {other!r}'s initial value"),
                    f"{key!r} starting from {other!r}'s initial value",
                    partial(_bind_initial, key, start),
                )
    reset = {m: keys for m in sorted(late & set(constants)) if (keys := sorted(mutable & set(constants[m])))}
    if reset:
        said = "; ".join(f"loading {m}() put {', '.join(map(repr, keys))} back" for m, keys in reset.items())
        yield _Fault(
            Mechanism(Kind.REINITIALISED, Role.STATE, said),
            "state put back to its initial value when a method loads after others ran",
            lambda modules: True,
            partial(_reinitialise, reset, initial),
        )


def _same_leaf(
    method: str,
    key: str,
    mine: torch.Tensor,
    constants: Mapping[str, Mapping[str, ConstantUse]],
    mutable: set[str],
    role: Callable[[str], Role],
) -> Iterator[_Fault]:
    """Each immutable tensor of the program under another path that ends in ``key``'s leaf name, of other
    content, bound in its place: a loader that binds by the last part of a path (``layers.1.weight`` read
    as ``layers.0.weight``, in one method or another), which is by name."""
    leaf = key.rpartition(".")[2]
    seen: set[str] = set()
    for other, theirs in sorted(constants.items()):
        for their_key, use in theirs.items():
            t = use.tensor
            if their_key == key or their_key in mutable or their_key.rpartition(".")[2] != leaf:
                continue
            if not (plain(t) and plain(mine)) or same_content(t, mine) or digest(t) in seen:
                continue
            seen.add(digest(t))
            yield _Fault(
                Mechanism(
                    Kind.BY_NAME,
                    role(key),
                    f"method {method!r} read method {other!r}'s {their_key!r} for its {key!r} (one leaf)",
                ),
                f"method {other!r}'s {their_key!r} in place of {method!r}'s {key!r}, of the same leaf name",
                partial(_bind_other, method, key, t),
            )


def _constant_state(
    base: Modules,
    constants: Mapping[str, Mapping[str, ConstantUse]],
    mutable: set[str],
    role: Callable[[str], Role],
) -> Iterator[_Fault]:
    """A constant bound to the memory of a state whose initial bytes it equals (it then follows the state's
    writes), and a state that starts from the bytes of a constant of its dtype and shape, other content
    (the evidence of last resort: only metadata ties them)."""
    states = {key: t for key in sorted(mutable) if (t := find_tensor(base, key)) is not None and plain(t)}
    for method, uses in sorted(constants.items()):
        for key, use in uses.items():
            if key in mutable or not plain(use.tensor):
                continue
            for state, initial in states.items():
                if same_content(initial, use.tensor):
                    yield _Fault(
                        Mechanism(
                            Kind.CONSTANT_STATE,
                            role(key),
                            f"method {method!r}'s {key!r} in the memory of state {state!r}, of its bytes",
                        ),
                        f"method {method!r}'s {key!r} bound to the memory of state {state!r}",
                        partial(_bind_to_state, method, key, state),
                    )
                elif (initial.dtype, initial.shape) == (use.tensor.dtype, use.tensor.shape):
                    yield _Fault(
                        Mechanism(
                            Kind.CONSTANT_STATE,
                            Role.STATE,
                            f"{state!r} started from method {method!r}'s {key!r}",
                        ),
                        f"{state!r} starting from method {method!r}'s {key!r}",
                        partial(_bind_initial, state, use.tensor.detach().clone()),
                        weak=True,
                    )


def _layouts(
    base: Modules, constants: Mapping[str, Mapping[str, ConstantUse]], role: Callable[[str], Role]
) -> Iterator[_Fault]:
    """Each tensor that is no row-major tensor at the start of its storage, read as its memory lies: with
    row-major strides from its offset, and from its storage's start."""
    keys = sorted({key for uses in constants.values() for key in uses})
    for key in keys:
        t = find_tensor(base, key)
        if t is None or not plain(t) or not t.numel() or (t.is_contiguous() and not t.storage_offset()):
            continue
        starts = sorted({t.storage_offset(), 0}, reverse=True)
        for start in starts:
            if start == t.storage_offset() and t.is_contiguous():
                continue
            where = "its storage's start" if start == 0 and t.storage_offset() else "its offset"
            read = t.detach().as_strided(t.shape, torch.empty(t.shape).stride(), start).clone()
            yield _Fault(
                Mechanism(Kind.LAYOUT_LOST, role(key), f"{key!r} read from {where} in memory order"),
                f"{key!r} read from {where} in memory order",
                partial(_bind_everywhere, key, read),
            )


def _bind_to_state(method: str, key: str, state: str, modules: Modules) -> bool:
    """``method``'s constant ``key`` is state ``state``'s own tensor (the one every method shares)."""
    live = find_tensor(modules, state)
    if live is None:
        return False
    set_tensor(modules[method], key, live)
    return True


def _bind_everywhere(key: str, tensor: torch.Tensor, modules: Modules) -> bool:
    """Every module's ``key`` bound to ``tensor`` (read from the eager modules before they were copied: a
    copy keeps no view's storage)."""
    found = False
    for module in modules.values():
        if find_tensor({"": module}, key) is not None:
            set_tensor(module, key, tensor.clone())
            found = True
    return found


def _lookalikes(
    method: str,
    constants: Mapping[str, Mapping[str, ConstantUse]],
    mutable: set[str],
    role: Callable[[str], Role],
) -> Iterator[_Fault]:
    """Each other immutable tensor of the program, under another name, that looks like one of ``method``'s
    own (``looks_alike``) or has its dtype and shape (``same_metadata``), bound in its place: what a cache
    keyed on less than the full content gives. One fault per distinct content; a same-named one is the
    by-name fault's."""
    others = [
        (other, key, use.tensor)
        for other, theirs in sorted(constants.items())
        for key, use in sorted(theirs.items())
        if key not in mutable and plain(use.tensor)
    ]
    first: list[_Fault] = []  # each key's first lookalike: a cache keyed on less than content takes them all
    for key, use in sorted(constants[method].items()):
        if key in mutable or not plain(use.tensor):
            continue
        seen: set[tuple[torch.dtype, tuple[int, ...], str]] = set()
        first_close = True
        for other, theirs, t in others:
            content = (t.dtype, tuple(t.shape), digest(t))
            tied = t.untyped_storage().data_ptr() == use.tensor.untyped_storage().data_ptr()
            if theirs == key or content in seen or tied:  # a view of its own storage is no lookalike
                continue
            alike = looks_alike(use.tensor, t)
            if not (alike or same_metadata(use.tensor, t)):
                continue
            seen.add(content)
            fault = _Fault(
                Mechanism(
                    Kind.LOOKALIKE,
                    role(key),
                    f"method {method!r} read {other!r}'s {theirs!r} for its {key!r}, which it looks like",
                ),
                f"method {other!r}'s {theirs!r} in place of {method!r}'s {key!r}",
                partial(_bind_other, method, key, t),
                weak=not alike,
            )
            if alike and first_close:
                first.append(fault)
                first_close = False
            yield fault
    if len(first) > 1:
        yield _Fault(
            Mechanism(Kind.LOOKALIKE, first[0].mechanism.of, "; ".join(f.mechanism.detail for f in first)),
            " and ".join(f.label for f in first),
            lambda modules: all(f.bind(modules) for f in first),
        )


def same_metadata(mine: torch.Tensor, theirs: torch.Tensor) -> bool:
    """Whether ``theirs`` has the dtype and shape of ``mine`` but other content: what a check of metadata
    alone takes for the same tensor (executorch PR #21959's cache compares dtype, sizes and strides)."""
    return (mine.dtype, mine.shape) == (theirs.dtype, theirs.shape) and not same_content(mine, theirs)


def _bind_other(method: str, key: str, theirs: torch.Tensor, modules: Modules) -> bool:
    set_tensor(modules[method], key, theirs.clone())
    return True


def _bind_private(method: str, key: str, modules: Modules) -> bool:
    own = find_tensor({method: modules[method]}, key)
    if own is None:
        return False
    set_tensor(modules[method], key, own.clone())
    return True


def _bind_one_memory(key: str, other: str, modules: Modules) -> bool:
    """The smaller of the two buffers becomes the first elements of the larger (both planned at one offset),
    starting from the larger's values: its initial data, written over the smaller's."""
    a, b = find_tensor(modules, key), find_tensor(modules, other)
    if a is None or b is None or a.dtype != b.dtype or not (a.is_contiguous() and b.is_contiguous()):
        return False
    if a.numel() < b.numel():
        a, b, other = b, a, key
    inner = a if a.shape == b.shape else a.view(-1)[: b.numel()].view(b.shape)
    for module in modules.values():
        if find_tensor({"": module}, other) is not None:
            set_tensor(module, other, inner)
    return True


def _written_back(first: str, second: str, modules: Modules) -> Callable[[], None]:
    """Around one call: two buffers that are one memory in a runtime that runs a functional program and
    copies each written buffer back after the call, in the program's order: the call reads the memory, and
    the last buffer it writes is what the memory holds after it."""
    a, b = find_tensor(modules, first), find_tensor(modules, second)
    assert a is not None and b is not None
    before = (a.clone(), b.clone())

    def after() -> None:
        written = [t for t, old in zip((a, b), before, strict=True) if not torch.equal(t, old)]
        if written:
            last = written[-1].clone()
            with torch.no_grad():
                a.copy_(last)
                b.copy_(last)

    return after


def _reinitialise(
    reset: Mapping[str, Sequence[str]], initial: Mapping[str, torch.Tensor], method: str, modules: Modules
) -> None:
    """``method`` loads: its state (``reset``) takes its ``initial`` values again, in the one tensor every
    method shares."""
    with torch.no_grad():
        for key in reset.get(method, ()):
            t = find_tensor(modules, key)
            if t is not None and key in initial:
                t.copy_(initial[key])


def _started_from(mine: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor | None:
    """What state ``mine`` holds when it starts from the first bytes of another state's initial value
    (``theirs``, at least as many bytes): a lowering that gave it the other's slot of initial data. None
    where that changes nothing, or gives zeros (a zero-filled start, which its own fault names)."""
    if not (plain(mine) and plain(theirs)) or theirs.nbytes < mine.nbytes or mine.numel() == 0:
        return None
    data = bytearray(bytes(tensor_bytes(theirs))[: mine.nbytes])
    start = torch.frombuffer(data, dtype=mine.dtype).reshape(mine.shape).clone()
    return None if same_content(start, mine) or not bool(start.any()) else start


def _bind_initial(key: str, start: torch.Tensor, modules: Modules) -> bool:
    """State ``key`` (one tensor every method shares) starts from ``start``."""
    t = find_tensor(modules, key)
    if t is None:
        return False
    with torch.no_grad():
        t.copy_(start)
    return True


def _bind_zeroed(key: str, modules: Modules) -> bool:
    zeroed = [t for t in (find_tensor({m: module}, key) for m, module in modules.items()) if t is not None]
    if not zeroed or not all(plain(t) for t in zeroed) or not any(bool(t.any()) for t in zeroed):
        return False
    with torch.no_grad():
        for t in zeroed:
            t.zero_()
    return True


def plain(t: torch.Tensor) -> bool:
    """A tensor of PyTorch's own, not a subclass (torchao's Int8Tensor weight, which has no bytes of its
    own to compare, and whose binding a loader never sees: lowering flattens it into plain tensors)."""
    return type(t) in (torch.Tensor, torch.nn.Parameter)


def _same(have: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    return len(have) == len(want) and all(
        h.shape == w.shape and Difference.between(h, w) is None for h, w in zip(have, want, strict=True)
    )
