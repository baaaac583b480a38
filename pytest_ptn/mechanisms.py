"""How a failure came about, as data: made once by the checks (the faulty-binding replays, the memory plan
of a lowered program, the step that raised or crashed) and read by causes, expectations and the fuzz.

A mechanism's ``key`` is what stays the same from program to program (the kind, what sort of tensor, which
step, the exception's type): never a generated name, so a known bug listed once covers every program that
shows it. Its ``detail`` names what this program showed it on (keys, methods), for people. A wrong value no
check accounts for is ``UNEXPLAINED``: a finding, never something a list of known failures can hold.
"""

from __future__ import annotations

import enum
import json
import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pytest_ptn.instruments.process_end import Ending, ProcessEnd


class Kind(enum.StrEnum):
    """What went wrong, whatever the program."""

    BY_NAME = "by-name"
    """A method read another method's tensor of the same name."""
    PRIVATE_COPY = "private-copy"
    """A method has its own copy of state the program shares: the other methods' writes never reach it."""
    ZERO_FILLED = "zero-filled"
    """A tensor starts zero-filled, not from its initial value (no data shipped for it)."""
    REINITIALISED = "reinitialised"
    """Shared state goes back to its initial value when a method loads after others ran: the load copies
    the method's initial values into the one allocation the program shares (executorch's ``load_method``
    with ``share_mutable_buffers``, https://github.com/pytorch/executorch/issues/21958)."""
    MISINITIALISED = "misinitialised"
    """State starts from another state's initial value, its memory its own: a lowering gave it the other's
    slot of initial data (executorch 1.5.1's emitter with ``emit_mutable_buffer_names``: an initialised
    buffer whose bytes equal a constant's takes that constant's index, which the runtime reads as a slot
    of mutable data; docs/findings/shared-state-private-state.md)."""
    CONSTANT_STATE = "constant-state"
    """A constant and a state confused: a constant bound to the memory of a state whose initial bytes it
    equals follows that state's writes (a dedupe that took state for a constant of its bytes, P5), or a
    state starts from the bytes of a constant of its dtype and shape."""
    LAYOUT_LOST = "layout-lost"
    """A tensor read from its storage in memory order, its strides or its offset lost: a transposed weight
    read as its memory lies, a slice read from its storage's start (a packer or a digest that reads the
    data pointer and the element count)."""
    ONE_MEMORY = "one-memory"
    """Two buffers live in one memory: a write to one changes the other."""
    WRITE_RETURNED = "write-returned"
    """A method's write to state comes back as an extra output and never reaches the state (a lowering
    dropped the buffer its method writes without reading)."""
    LOOKALIKE = "lookalike"
    """A method read another tensor that looks like its own but is not, whatever its name: the same bytes
    under another dtype or shape, equal but for a few elements, or only of the same dtype and shape (a
    dedupe or a cache keyed on less than the full content: bytes without their dtype, a digest of a prefix,
    closeness, metadata alone)."""
    SHARED_ARENA = "shared-arena"
    """A buffer's planned memory is also used by another method's tensors (the lowered program's memory
    plan says so): what that method leaves there is what the buffer reads."""
    SHARES_DIFFERING = "shares-differing"
    """Constants of other content under different names share one allocation (S2, S3): a loader that
    shares on less than the content, found in its storage, not in a value."""
    NOT_SHARED = "not-shared"
    """Identical constants of several methods occupy several allocations (S1)."""
    MEMORY_PENALTY = "memory-penalty"
    """Constant memory beyond one copy of each unique tensor (S6)."""
    CROSS_PROGRAM = "cross-program"
    """A second program in the process reads the first's data (S4) where no binding by name gives its
    values."""
    LOWERING = "lowering"
    """Lowering raised."""
    ERROR = "error"
    """Loading or running raised."""
    CRASH = "crash"
    """The process died (a signal) at a step."""
    HANG = "hang"
    """A step made no progress within the run's limit."""
    UNEXPLAINED = "unexplained"
    """A wrong value nothing accounts for."""


class Role(enum.StrEnum):
    """What sort of tensor a value mechanism involves."""

    STATE = "state"
    """A buffer some method writes."""
    BUFFER = "buffer"
    """A buffer no method writes."""
    CONSTANT = "constant"
    """A parameter, an attribute or a lifted constant."""


class Step(enum.StrEnum):
    """Where in judging a program a mechanism that is no wrong value happened."""

    LOWERING = "lowering"
    """Lowering the program."""
    RUNNING = "running"
    """Loading its methods and calling them, under every load schedule."""


@dataclass(frozen=True)
class Traits:
    """What the project says of one mechanism kind, in one place: the cause it makes, the roles its key
    names, and where a replay binds it."""

    cause: str
    """The cause it makes in the reports (pytest_ptn.reporting.causes): what tests are grouped under."""
    words: str
    """The cause's sentence: ``{of}`` what it involves, ``{detail}`` the first test's own names."""
    roles: frozenset[Role] = frozenset()
    """The sorts of tensor its key names (``kind:role``), for a kind that accounts for wrong values; none
    for one keyed by a step (an error, a crash) or by nothing."""
    storage: bool = False
    """A storage rule's finding (S1-S6), which a drawn program never shows."""
    binding_order: int | None = None
    """Where a replay that binds two faults at once binds this one (check.explain): memory first, then
    what it starts from (zero-filling one of two buffers in one memory zero-fills both)."""


_ANY = frozenset(Role)

TRAITS: dict[Kind, Traits] = {
    Kind.BY_NAME: Traits(
        "constants shared by name",
        "the loader binds constants by name across methods: {detail}, another tensor of that name",
        _ANY,
        binding_order=0,
    ),
    Kind.LOOKALIKE: Traits(
        "constants shared by less than their content",
        "the loader shares constants whose content only looks the same (the same bytes under another dtype "
        "or shape, equal but for a few elements): a cache or dedupe keyed on less than dtype, shape and "
        "every byte: {detail}",
        _ANY,
        binding_order=0,
    ),
    Kind.PRIVATE_COPY: Traits(
        "state copied per method",
        "each method gets a private copy of the state the program shares: a write by one method is not seen "
        "by the others (e.g. {detail})",
        _ANY,
        binding_order=1,
    ),
    Kind.REINITIALISED: Traits(
        "state re-initialised on load",
        "loading a method after others ran puts the state the program shares back to its initial value: "
        "the load copies initial values into the one shared allocation (e.g. {detail})",
        _ANY,
        binding_order=1,
    ),
    Kind.ZERO_FILLED: Traits(
        "tensor starts zero-filled",
        "{of} starts zero-filled, not from its initial value: the lowering ships no data for it "
        "(e.g. {detail})",
        _ANY,
        binding_order=3,
    ),
    Kind.MISINITIALISED: Traits(
        "state starts from another's initial value",
        "state starts from another state's initial value: the lowering gave it the other's slot of initial "
        "data (e.g. {detail})",
        _ANY,
        binding_order=3,
    ),
    Kind.CONSTANT_STATE: Traits(
        "constants and state confused",
        "a constant and a state are confused: a constant bound to the memory of the state whose initial "
        "bytes it equals follows the state's writes, or state starts from a constant's bytes (e.g. {detail})",
        _ANY,
        binding_order=0,
    ),
    Kind.LAYOUT_LOST: Traits(
        "tensor layout lost",
        "{of} is read from its storage in memory order, its strides or offset lost: a packer or a digest "
        "that reads a tensor's data pointer and element count (e.g. {detail})",
        _ANY,
        binding_order=0,
    ),
    Kind.ONE_MEMORY: Traits(
        "buffers in one memory",
        "two buffers live in one memory: a write to one changes the other (e.g. {detail})",
        _ANY,
        binding_order=2,
    ),
    Kind.WRITE_RETURNED: Traits(
        "state write returned as an output",
        "a write to state comes back as an extra output and never reaches the state: the lowering dropped "
        "a buffer its method writes without reading (e.g. {detail})",
        _ANY,
    ),
    Kind.SHARED_ARENA: Traits(
        "state in another method's memory",
        "state lives where another method keeps tensors, as the lowered program's memory plan says: "
        "what that method leaves there is what the state reads (e.g. {detail})",
        _ANY,
    ),
    Kind.SHARES_DIFFERING: Traits(
        "different constants share storage",
        "the loader shares constants whose bytes differ, not only same-named ones: {detail}",
        storage=True,
    ),
    Kind.NOT_SHARED: Traits(
        "identical constants not shared",
        "identical constants of several methods are not shared (e.g. {detail})",
        storage=True,
    ),
    Kind.MEMORY_PENALTY: Traits("memory penalty", "{detail}", storage=True),
    Kind.CROSS_PROGRAM: Traits(
        "data leaks between programs",
        "a second program in the process reads the first's data (e.g. at {detail})",
        storage=True,
    ),
    Kind.LOWERING: Traits("lowering error", "lowering fails: {detail}"),
    Kind.ERROR: Traits("error", "{detail}"),
    Kind.CRASH: Traits("crash", "{detail}"),
    Kind.HANG: Traits("hang", "{detail}"),
}
"""Every kind but UNEXPLAINED, which is no cause (a wrong value nothing accounts for: its test's symptom is)
and which no expectation lists."""

LISTABLE_VALUE_KINDS = tuple(kind for kind, traits in TRAITS.items() if traits.roles)
"""The kinds that account for wrong values (and for errors a faulty binding reproduces); their key is
``kind:tensor``."""

STORAGE_KINDS = tuple(kind for kind, traits in TRAITS.items() if traits.storage)
"""The kinds the storage rules' tests find in a loader's allocations or across programs; a drawn program
never shows one, so no list of the fuzz's known failures holds one."""


@dataclass(frozen=True)
class Raised:
    """An exception as a key keeps it: the step it raised at, its type, and its message's first line with
    what varies between programs left out (``text``; "" where it said nothing)."""

    step: Step
    error: str
    """The exception's type name."""
    text: str = ""

    def __str__(self) -> str:
        what = f"{self.error}: {self.text}" if self.text else self.error
        return what if self.step == Step.LOWERING else f"{self.step}:{what}"


@dataclass(frozen=True)
class Ended:
    """How a process ended at a step, as a key keeps it: a signal's name, or one of Ending; never a number."""

    step: Step
    end: str

    def __str__(self) -> str:
        return f"{self.step}:{self.end}"


Of = Role | Step | Raised | Ended
"""What a mechanism involves: a Role for a wrong value, the step of a hang, an exception, a process's end."""


@dataclass(frozen=True)
class Mechanism:
    """One way a failure came about: ``kind``, what it involves (``of``), and the program's own names in
    ``detail``."""

    kind: Kind
    """What went wrong."""
    of: Of | None = None
    """What it involves, the same in every program (None: nothing more than its kind)."""
    detail: str = ""
    """The program's own names (keys, methods), for people; never part of the key."""

    @property
    def key(self) -> str:
        """What an expectation lists: ``zero-filled:state``, ``error:running:RuntimeError``."""
        return f"{self.kind.value}:{self.of}" if self.of else self.kind.value

    def __str__(self) -> str:
        return f"{self.key} ({self.detail})" if self.detail else self.key


def of_key(kind: Kind, text: str) -> Of | None:
    """What a key's part after ``kind:`` says (``text``, as ``Mechanism.key`` writes it and an expectation
    lists it); ValueError where it says nothing a mechanism of ``kind`` can involve."""
    if not text:
        return None
    if kind == Kind.LOWERING:
        error, _, said = text.partition(": ")
        return Raised(Step.LOWERING, error, said)
    step_text, _, rest = text.partition(":")
    if kind == Kind.ERROR:
        error, _, said = rest.partition(": ")
        if not error:
            raise ValueError(f"{kind.value}:{text} names no exception type")
        return Raised(Step(step_text), error, said)
    if kind == Kind.CRASH:
        if rest not in set(Ending) and rest not in signal.Signals.__members__:
            raise ValueError(f"{rest!r} is no signal's name nor one of {', '.join(Ending)}")
        return Ended(Step(step_text), rest)
    if kind == Kind.HANG:
        return Step(text)
    return Role(text)


UNEXPLAINED = Mechanism(Kind.UNEXPLAINED)

PROPERTY = "ptn_mechanisms"
"""The test property (``item.user_properties``) that carries a failed test's mechanisms, as JSON, to the
reports: the causes group failures by them (pytest_ptn.reporting.causes)."""


def to_json(found: Iterable[Mechanism]) -> str:
    """``found`` as the PROPERTY's value: each mechanism once, in the order found."""
    return json.dumps(to_data(found))


def to_data(found: Iterable[Mechanism]) -> list[dict[str, str]]:
    """``found`` as JSON data (``from_data`` reads it): each mechanism once, in the order found, what it
    involves as its key writes it."""
    return [{"kind": m.kind.value, "of": str(m.of or ""), "detail": m.detail} for m in dict.fromkeys(found)]


def from_data(data: Any) -> tuple[Mechanism, ...]:
    """The mechanisms ``to_json`` wrote (parsed); ValueError for anything else."""
    if not isinstance(data, list | tuple):
        raise ValueError(f"mechanisms must be a list, not {type(data).__name__}")
    out = []
    for item in data:
        if not isinstance(item, dict) or set(item) != {"kind", "of", "detail"}:
            raise ValueError(f"a mechanism is an object of kind, of and detail, not {item!r}")
        if not all(isinstance(v, str) for v in item.values()):
            raise ValueError(f"a mechanism's kind, of and detail are text: {item!r}")
        try:
            kind = Kind(item["kind"])
        except ValueError:
            raise ValueError(f"unknown mechanism kind {item['kind']!r}") from None
        try:
            of = of_key(kind, item["of"])
        except ValueError as e:
            raise ValueError(f"mechanism {kind.value}:{item['of']}: {e}") from None
        out.append(Mechanism(kind, of, item["detail"]))
    return tuple(out)


def isolation_only(m: Mechanism) -> bool:
    """A mechanism that binds a tensor from the wrong data or memory, never a kernel's arithmetic: another
    method's tensor, state shared wrongly, a constant bound to state, a tensor read with its layout lost. A
    value it explains is an isolation defect whatever the method alone gives (alone, the same loader binds
    the same wrong data). A zero-filled constant is not: the method alone may start from zeros too, and then
    it is that method's own."""
    return m.kind in (Kind.BY_NAME, Kind.CONSTANT_STATE, Kind.LAYOUT_LOST) or m.of == Role.STATE


def raised(step: Step, error: BaseException, names: Iterable[str]) -> Mechanism:
    """The mechanism of an exception at ``step`` (lowering, running): its type and its message's first line,
    with what varies between programs (numbers, quoted names, the program's own ``names`` of its methods)
    left out, are the key; the detail is the type and that line as they were. ``names`` is required: one
    error keyed with the names in one front end and without them in another would be two mechanisms."""
    said = first_line(error)
    error_type = type(error).__name__
    text = without_names(said, names)[: max(0, MESSAGE_IN_KEY - len(error_type) - 2)] if said else ""
    return Mechanism(
        Kind.LOWERING if step == Step.LOWERING else Kind.ERROR, Raised(step, error_type, text), stated(error)
    )


def first_line(error: BaseException) -> str:
    """An exception's message's first line ("" where it said nothing)."""
    return str(error).strip().splitlines()[0].strip() if str(error).strip() else ""


def stated(error: BaseException) -> str:
    """An exception as it reads: its type and its message's first line."""
    said = first_line(error)
    return f"{type(error).__name__}: {said}" if said else type(error).__name__


MESSAGE_IN_KEY = 120
"""How much of an exception's message a key keeps: enough to tell errors of one type apart."""


def crashed(step: Step, end: ProcessEnd, detail: str = "") -> Mechanism:
    """A process that died at ``step`` as ``end`` says (its key: the signal's name, ``status`` or ``no
    report``, never a number); ``detail``, for people, is how it ended unless given."""
    return Mechanism(Kind.CRASH, Ended(step, end.key), detail or str(end))


def hung(step: Step, detail: str = "") -> Mechanism:
    """A process that made no progress at ``step`` within the run's limit."""
    return Mechanism(Kind.HANG, step, detail)


def without_names(message: str, names: Iterable[str] = ()) -> str:
    """``message`` with what varies between programs left out: quoted names, ``names`` where they stand as
    words (executorch's ``Failed to load method prefill``), dtypes (``Expected: Int, Got: Half`` and
    ``Expected: Float, Got: long int`` are one message), numbers and the shapes they make."""
    message = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", message)
    if bare := sorted(set(names), key=len, reverse=True):
        message = re.sub(rf"\b(?:{'|'.join(map(re.escape, bare))})\b", "…", message)
    message = _DTYPE.sub("<dtype>", message)
    message = re.sub(r"\d+", "N", message)
    return re.sub(r"[\[(]N(?:, ?N)*,?[\])]", "[…]", message)


_DTYPE = re.compile(
    r"\b(?:torch\.|c10::|at::|ScalarType::)?(?:"
    r"(?:(?:unsigned|signed) )?(?:long long|long|short) int|(?:unsigned|signed) char|long long"
    r"|u?int(?:8|16|32|64)|float(?:8_\w+|16|32|64)|bfloat16|complex(?:32|64|128)"
    r"|Byte|Char|Short|Int|Long|Half|Float|Double|BFloat16|Bool|ComplexHalf|ComplexFloat|ComplexDouble"
    r"|int|long|short|float|double|bool|half"
    r")\b"
)
"""A dtype as torch, c10 and executorch name one in a message."""


def _parses(kind: Kind, of: str) -> bool:
    try:
        of_key(kind, of)
    except ValueError:
        return False
    return True


class MechanismKeyError(ValueError):
    """A mechanism key an expectation cannot list."""


def check_key(key: str) -> str:
    """``key`` if a known failure may list it; MechanismKeyError saying why not (an unknown kind, a value
    kind without its tensor, ``unexplained``)."""
    kind_text, _, of = key.partition(":")
    try:
        kind = Kind(kind_text)
    except ValueError:
        kinds = ", ".join(k.value for k in Kind if k != Kind.UNEXPLAINED)
        raise MechanismKeyError(f"unknown mechanism {key!r} (its kind is one of {kinds})") from None
    if kind == Kind.UNEXPLAINED:
        raise MechanismKeyError(
            "'unexplained' is no mechanism: a wrong value nothing accounts for is a finding to look into, "
            "never a known failure"
        )
    if kind in STORAGE_KINDS:
        raise MechanismKeyError(
            f"{key!r} is a storage rule's finding (S1-S6), which a drawn program never shows: list the "
            f"scenario test that fails on it (rule and scenario) instead"
        )
    if kind in LISTABLE_VALUE_KINDS and of not in {t.value for t in Role}:
        tensors = ", ".join(f"{kind.value}:{t.value}" for t in Role)
        raise MechanismKeyError(f"unknown mechanism {key!r} (one of {tensors})")
    if kind not in LISTABLE_VALUE_KINDS and not of:
        raise MechanismKeyError(f"mechanism {key!r} names no step or exception type")
    if kind == Kind.CRASH and not _parses(kind, of):
        raise MechanismKeyError(
            f"mechanism {key!r} is not how a process ended: its key is crash:<step>:<end>, the step one of "
            f"{', '.join(Step)}, the end a signal's name (SIGSEGV) or one of {', '.join(Ending)}"
        )
    if kind not in LISTABLE_VALUE_KINDS and without_names(of) != of:
        raise MechanismKeyError(
            f"mechanism {key!r} holds what varies between programs (a number, a name, a dtype or a shape): "
            f"its key is {kind.value}:{without_names(of)}"
        )
    return key
