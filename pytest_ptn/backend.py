"""The one protocol every backend implements, and how a backend is found by name.

A backend lowers a dict of ExportedPrograms into an artifact and loads it; optional views (package
contents, storage identity, state, constant memory) are promised by its capabilities, which decide the rules
that apply to it. Adding a backend is a module with a Backend subclass plus an entry point in the
``pytest_ptn.backends`` group (or ``--ptn-backend=package.module:Class`` for one not installed).
"""

from __future__ import annotations

import enum
import importlib
import importlib.metadata
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pytest_ptn import DISTRIBUTION
from pytest_ptn.instruments.comparison import Tolerance

if TYPE_CHECKING:
    import torch

    from pytest_ptn.spec import Scenario

ENTRY_POINT_GROUP = "pytest_ptn.backends"
WIDE_RUN = "wide"
"""In a repro bundle's calls file: the prefix under which a reduced-precision program's float64 eager run
(EagerCall.wide) is stored, with eager's own keys behind it."""


@dataclass
class EagerCall:
    """What eager PyTorch did on one call of the sequence."""

    method: str
    """The method called."""
    inputs: tuple[torch.Tensor, ...]
    """Its inputs as given, before the call could mutate them."""
    outputs: list[torch.Tensor]
    """Its outputs: what each backend's run of the call is compared with."""
    inputs_after: tuple[torch.Tensor, ...]
    """The inputs after the call, for a method that mutates its inputs in place."""
    state_after: dict[str, torch.Tensor]
    """Every mutable buffer after the call, by FQN: what a state view must show then (E3-E5)."""
    wide: EagerCall | None = None
    """The same call when eager runs the program widened to float64, for a reduced-precision program: how
    far eager's own rounding moves each value (pytest_ptn.instruments.comparison); None where it cannot
    move it."""

    def output_bounds(self) -> list[torch.Tensor | None]:
        """Each output's float64 counterpart for the comparison, or None."""
        return [None] * len(self.outputs) if self.wide is None else list(self.wide.outputs)

    def widened(self, key: str) -> torch.Tensor | None:
        """State ``key`` after this call in the float64 run, or None."""
        return None if self.wide is None else self.wide.state_after.get(key)


class Capability(enum.Enum):
    """A view a backend can show of what it lowered or loaded: the rules whose checks need a view apply only
    to the backends that have it (pytest_ptn.ruleset.RULE_NEEDS); the others report them as not applicable."""

    PACKAGE = "package"
    """Lowering writes a package with named data that ``Lowered.package()`` shows (P rules)."""
    EXECUTE = "execute"
    """Loaded methods run (E rules)."""
    STORAGE = "storage"
    """``Loaded.storage()`` tells which constants share one allocation (S1-S5, S7)."""
    STATE = "state"
    """``Loaded.state()`` shows mutable buffers between calls (stronger E3-E5 checks)."""
    MEMORY = "memory"
    """``Loaded.constant_memory()`` measures what loading allocated for constants (S6)."""
    QUANTIZE = "quantize"
    """Lowering quantizes each method first (``Backend.quantize``): the truth is the converted per-method
    modules, compared within ``Backend.tolerance``, on the quantization-friendly scenarios only."""


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run on this machine, and why not: a requested backend that cannot is a usage
    error with the reason, never an all-skipped green run."""

    available: bool
    """Whether the backend can lower and load here."""
    reason: str = ""
    """Why the backend cannot run here; for one that can, what a reader of its results must know (the run
    header and ``list backends`` show it)."""
    versions: dict[str, str] = field(default_factory=dict)
    """Distribution -> installed version of what the backend runs on: reports' provenance, and what an
    expectations file's ``requires`` is matched against."""


@dataclass(frozen=True)
class ReducedPrecision:
    """A backend that computes float32 programs in a coarser dtype on this machine (a vendor default it offers
    no way to turn off). Its float32 results are compared with that dtype's rounding steps (``computed_in``
    in pytest_ptn.instruments.comparison), against each method alone and against eager alike, and every
    difference is labelled with ``why``: the verdict does not depend on the CPU."""

    dtype: str
    """torch's name of the dtype it computes in: ``bfloat16``, ``float16``."""
    why: str
    """What a reader must know, one line: who computes in which precision, and the setting that decides it."""


@dataclass(frozen=True)
class Entry:
    """A stored tensor of a package, described without reading its bytes."""

    dtype: str
    """torch's name of its dtype."""
    shape: tuple[int, ...]
    """Its shape."""
    nbytes: int
    """The bytes it takes in the package: P4 sums them."""

    @classmethod
    def of(cls, t: torch.Tensor) -> Entry:
        """``t`` as a package stores it whole: its dtype's torch name, its shape, its bytes."""
        return cls(str(t.dtype).removeprefix("torch."), tuple(t.shape), t.numel() * t.element_size())


@dataclass(frozen=True)
class Reference:
    """A place in a package that names a data key; ``where`` says which field (binding, mutation target)."""

    method: str
    """The method whose field it is."""
    where: str
    """Which field: a constant binding, a mutation target, a quantization parameter, a nested graph's."""
    name: str
    """The data key it names: P3 requires one that is stored, under its final name."""


@dataclass
class PackageView:
    """What a package holds, as read back from the file: the P rules are checked against this."""

    bindings: dict[str, dict[str, str]]
    """method -> key as the exported program names it -> final name."""
    references: list[Reference]
    """Every place in the package that names a data key."""
    entries: dict[str, Entry]
    """owners: final name -> stored tensor."""
    aliases: dict[str, str]
    """alias -> owner."""
    state_keys: set[str]
    """The final names of mutable state (``state/<key>``, P2): never deduped (P5)."""
    read: Callable[[str], torch.Tensor]
    """The tensor stored under a final name, aliases resolved."""


@dataclass(frozen=True)
class MemoryReading:
    """What loading a program's constants cost in memory, and by which instrument (S6)."""

    peak_bytes: int
    """The peak bytes allocated while the constants loaded."""
    probe: str
    """Which instrument produced the number, for the report."""
    resolution: int = 0
    """The smallest growth the instrument can see (a GPU driver maps memory in pages): S6 allows one."""


@dataclass(frozen=True)
class Ownership:
    """Which of a lowered program's constants the backend under test holds, per method, against the ones it
    left to another path (a delegate's, to the portable kernels around it): a test whose constants the backend
    holds none of did not exercise it, whatever it passed (Spec v6, "not exercised")."""

    owned: dict[str, frozenset[str]]
    """method -> the constants the backend under test holds (a delegate's payload or named data), by the
    name the lowered program gives each."""
    left: dict[str, frozenset[str]]
    """method -> the constants the lowered program keeps outside the backend under test."""

    def counts(self) -> tuple[int, int]:
        """(constants owned, constants in all), over every method."""
        owned = sum(len(names) for names in self.owned.values())
        return owned, owned + sum(len(names) for names in self.left.values())


OWNED_PROPERTY = "ptn_owned"
"""The test property (``report.user_properties``) that carries how many of the constants a test checked the
backend under test held: JSON ``[held, checked]`` (Ownership.counts)."""


class Lowered(ABC):
    """A lowered program: the artifact on disk plus whatever the backend needs to load it."""

    path: Path
    """The artifact the lowering wrote (a package, a ``.pte``): a repro bundle copies it."""

    def package(self) -> PackageView:
        """What the package holds, read back from the file (Capability.PACKAGE): the P rules check this."""
        raise NotImplementedError(f"{type(self).__name__} has no package view")

    def files(self) -> dict[str, Path]:
        """What this lowering wrote, by the attribute that holds each path (``path``, and e.g. a ``.ptd``'s
        ``data_path``): a repro bundle copies them, and points the same attributes of a new lowering of the
        program at the copies."""
        return {"path": self.path}

    def shared_memory(self) -> dict[str, dict[str, set[str]]]:
        """method -> each state key of its whose planned memory other methods' tensors also use -> those
        methods, as the artifact's own memory plan says; ``{}`` where it has none (the default) or keeps every
        method's memory apart. Evidence for a wrong value no replay reproduces."""
        return {}

    def ownership(self) -> Ownership | None:
        """Which of the program's constants the backend under test holds (a delegate says which it took);
        None, the default: unknown, never assumed either way."""
        return None

    def bundle_scripts(
        self, calls_file: str, files: dict[str, str], calls: Sequence[EagerCall]
    ) -> dict[str, str]:
        """Extra scripts for a repro bundle, file name -> text: e.g. the same replay through the backend's own
        runtime alone, for its engineers. ``files`` says where each of ``files()`` lies in the bundle and
        ``calls_file`` where the calls are (safetensors: ``<call>/<inputs|outputs|inputs_after>/<index>``, and
        for a reduced-precision program the float64 eager run the comparison's bound needs under the same
        keys behind ``WIDE_RUN/``)."""
        return {}


class Loaded(ABC):
    """One loaded copy of a program: state belongs to it, never to other copies."""

    @abstractmethod
    def load_method(self, method: str) -> None:
        """Load (bind constants of) one method; ``run`` loads on first use."""

    @abstractmethod
    def run(self, method: str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Call a method; mutations of inputs are written into ``inputs`` as eager does."""

    def storage(self, method: str, key: str) -> int:
        """Identity of the allocation behind constant ``key`` (as the exported program names it)."""
        raise NotImplementedError(f"{type(self).__name__} has no storage view")

    def state(self) -> dict[str, torch.Tensor]:
        """Current mutable buffers by the FQN the exported programs give them."""
        raise NotImplementedError(f"{type(self).__name__} has no state view")

    def constant_memory(self) -> MemoryReading:
        """Peak memory this copy's loading allocated for immutable constants."""
        raise NotImplementedError(f"{type(self).__name__} has no memory probe")


VARIANT_SEPARATOR = "@"
"""``name@variant`` names one of the backends a name stands for (``Backend.variants``):
``myrt@shared-state``."""


class Whose(enum.StrEnum):
    """Whose a failure is, for a backend with a witness (``Backend.witness``): what the reports group by,
    carried as data (WHOSE_PROPERTY), never read back from the words."""

    RUNTIME = "runtime"
    """The witness gives eager's values on the same artifact: the runtime's own."""
    LOWERING = "lowering"
    """The witness does the same on the same artifact: the lowering's or upstream's."""


WHOSE_PROPERTY = "ptn_whose"
"""The test property (``item.user_properties``) that says whose a failed test's failure is (a Whose)."""


def whose_of(found: Iterable[Whose]) -> Whose | None:
    """Whose a test's failure is, of what its checks found: the runtime's own where any part is (what its
    author has to fix), else the lowering's."""
    found = set(found)
    return Whose.RUNTIME if Whose.RUNTIME in found else Whose.LOWERING if found else None


RUNTIME_FAULT = "the runtime's own"
"""A failure the witness does not show (it gives eager's values on the same artifact)."""
LOWERING_FAULT = "the lowering's or upstream's, not the runtime's"
"""A failure the witness shows too (the same values on the same artifact)."""


@dataclass(frozen=True)
class Witness:
    """Another runtime's load of a lowered program (``Backend.witness``), and the words that name it."""

    loaded: Loaded
    """The witness's own loaded copy of the program, run on the same calls as the backend's."""
    by: str
    """Who runs what, as a failure says it: ``executorch.runtime on the same .pte``."""

    @staticmethod
    def whose(same: bool, eager: bool) -> Whose | None:
        """Whose a failure is, from whether the witness gives the backend's values or eager's (None: it
        gives other values still, which says neither)."""
        return Whose.LOWERING if same else Whose.RUNTIME if eager else None

    def says(self, same: bool, eager: bool) -> str:
        """Whose a failure is, in words."""
        whose = self.whose(same, eager)
        if whose is Whose.LOWERING:
            return f"{self.by} gives the same: {LOWERING_FAULT}"
        if whose is Whose.RUNTIME:
            return f"{self.by} gives eager's values: {RUNTIME_FAULT}"
        return f"{self.by} gives other values"


class Backend(ABC):
    """What the suite lowers and loads programs through: subclass it, implement ``availability``, ``lower``
    and ``load``, declare ``capabilities``, and register it as an entry point in ``pytest_ptn.backends``.
    The suite makes instances with no arguments: one for the run, which lowers, and one per test, which
    loads, so a cache a loader keeps on its instance never carries one test's programs into another's."""

    name: ClassVar[str]
    """What ``--ptn-backend`` calls it, and the backend named in test ids, reports and expectation files."""
    capabilities: ClassVar[frozenset[Capability]]
    """The views this backend can show: they decide which rules apply to it."""
    tolerance: ClassVar[Tolerance | None] = None
    """What a backend that quantizes (Capability.QUANTIZE) may differ by from its converted modules, beyond
    the dtype's bound (pytest_ptn.instruments.comparison): declared by the backend, with its derivation."""
    variant_of: ClassVar[tuple[type[Backend], str] | None] = None
    """For a class ``variant()`` made: the class it was made from and the variant's name, which is what
    makes it again in another process."""

    @classmethod
    def variants(cls) -> tuple[str, ...]:
        """The backends this name stands for, run each in its own right (``name@variant``): a runtime of .pte
        files runs every lowering it supports. None by default: the name is one backend."""
        return ()

    @classmethod
    def variant(cls, variant: str) -> type[Backend]:
        """The class of ``name@variant``, one of ``variants()``."""
        known = ", ".join(cls.variants()) or "none"
        raise BackendNotFound(f"backend {cls.name!r} has no variant {variant!r} (variants: {known})")

    def witness(self, lowered: Lowered) -> Witness | None:
        """Another runtime's load of the same artifact, whose results say whose a failure is: for a runtime of
        .pte files, executorch.runtime's (pytest_ptn.backends.pte_runtime). None: no witness."""
        return None

    @classmethod
    @abstractmethod
    def availability(cls) -> Availability:
        """Whether this machine can run the backend, cheaply: never import torch or executorch here."""

    @classmethod
    def load_runtime(cls) -> None:
        """Import and initialise what ``load()`` needs (a C++ extension, a driver), raising what that raises:
        a runtime built against another torch fails here (``ImportError: ... undefined symbol``), not in
        every test. Asked once per test process before its first test, where torch is imported anyway
        (``availability()`` runs when the plugin loads, and must stay cheap); an exception makes the backend
        unavailable, with it as the reason. Nothing to do by default."""
        return None

    def float32_computed_in(self) -> ReducedPrecision | None:
        """The coarser dtype this backend computes float32 programs in on this machine; None: float32."""
        return None

    def keeps_no_state(self) -> str | None:
        """Why this backend keeps no mutable buffer from one call to the next (each call runs on its own, as
        on a simulator), or None: a program that writes state is then not applicable to it, never passed."""
        return None

    def unsupported(self, scenario: Scenario) -> str | None:
        """Why this backend cannot express ``scenario`` at all (reported as not applicable), or None."""
        return None

    def quantize(self, method: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.nn.Module:
        """One method's module quantized by the backend's recipe (Capability.QUANTIZE), calibrated with
        ``inputs``: what ``lower`` is then given, exported, and what eager runs as the truth. Calibration may
        write the module's buffers; the caller restores them."""
        raise NotImplementedError(f"{type(self).__name__} does not quantize")

    @abstractmethod
    def lower(self, programs: dict[str, torch.export.ExportedProgram], workdir: Path) -> Lowered:
        """Lower fresh ExportedPrograms (method name -> program) into an artifact under ``workdir``."""

    @abstractmethod
    def load(self, lowered: Lowered) -> Loaded:
        """Load a fresh, independent copy of a lowered program."""


class BackendError(Exception):
    """A backend that cannot be used as given; the one-line message names the spec and what is wrong."""


class BackendNotFound(BackendError, LookupError):
    """No backend by that name, or its module cannot be imported."""


PROJECT_BACKENDS = {
    "reference": "pytest_ptn.backends.reference:ReferenceBackend",
    "native": "pytest_ptn.backends.native.backend:NativeBackend",
    "pte": "pytest_ptn.backends.pte:PteBackend",
    "pte-xnnpack": "pytest_ptn.backends.pte:XnnpackBackend",
    "pte-external": "pytest_ptn.backends.pte:ExternalConstantsBackend",
    "pte-shared-state": "pytest_ptn.backends.pte:SharedStateBackend",
    "aoti": "pytest_ptn.backends.aoti.backend:AotiBackend",
    "aoti-upstream": "pytest_ptn.backends.aoti.backend:AotiUpstreamBackend",
    "cuda": "pytest_ptn.backends.cuda:CudaDelegateBackend",
    "openvino": "pytest_ptn.backends.openvino:OpenvinoBackend",
}
"""This project's own backends, as pyproject.toml's entry points name them (a test keeps the two equal): a
source checkout run with ``-p pytest_ptn.plugin`` and nothing installed (an air-gapped GPU runner) has no
entry points, yet ``--ptn-backend=aoti`` must mean the same there."""


EXT_PREFIX = "ext:"
"""``ext:<flow>`` names a TestFlow of ExecuTorch's backend test suite (pytest_ptn.backends.ext)."""
EXT_FLOWS = "pytest_ptn.backends.ext:flow_backend"
"""What makes the backend class of a flow name: imported only when an ``ext:`` backend is asked for."""


def installed_backends() -> dict[str, importlib.metadata.EntryPoint]:
    """Backends by name: the entry points of every installed distribution, plus this project's own when
    pytest-ptn itself is not installed (its modules imported from a source checkout)."""
    found = {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    if package_version(DISTRIBUTION) is not None:
        return found
    own = {
        name: importlib.metadata.EntryPoint(name, value, ENTRY_POINT_GROUP)
        for name, value in PROJECT_BACKENDS.items()
    }
    return {**own, **found}


def one_line(e: BaseException) -> str:
    """An exception raised by a backend's own code, as one line of a usage error."""
    return f"{type(e).__name__}: {' '.join(str(e).split())}"


def is_module_class_path(spec: str) -> bool:
    module_name, _, attr = spec.partition(":")
    return all(part.isidentifier() for part in module_name.split(".")) and attr.isidentifier()


def resolve_backend(spec: str) -> type[Backend]:
    """A concrete backend class from an installed name or a ``module:Class`` path.

    Importing runs the backend's own code, so any exception it raises is reported as BackendNotFound.
    ``name@variant`` is one of the variants a backend name stands for; ``ext:<flow>`` is a flow of
    ExecuTorch's backend test suite, looked up before ``module:Class``."""
    if VARIANT_SEPARATOR in spec:
        base, _, variant = spec.rpartition(VARIANT_SEPARATOR)
        cls = resolve_backend(base).variant(variant)
    elif spec.startswith(EXT_PREFIX):
        cls = ext_flow_backend(spec.removeprefix(EXT_PREFIX))
    elif ":" in spec:
        if not is_module_class_path(spec):
            raise BackendNotFound(f"{spec!r} is neither an installed backend nor a module:Class path")
        module_name, _, attr = spec.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except Exception as e:
            raise BackendNotFound(f"cannot import backend {spec!r}: {one_line(e)}") from e
    else:
        installed = installed_backends()
        if spec not in installed:
            known = ", ".join(sorted(installed)) or "none"
            raise BackendNotFound(f"unknown backend {spec!r} (installed: {known})")
        try:
            cls = installed[spec].load()
        except Exception as e:
            raise BackendNotFound(
                f"cannot import backend {spec!r} ({installed[spec].value}): {one_line(e)}"
            ) from e
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise BackendError(f"{spec!r} is not a pytest_ptn.backend.Backend subclass")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise BackendError(f"backend {spec!r} is abstract: it does not implement {missing}")
    return cls


def ext_flow_backend(flow: str) -> type[Backend]:
    """The backend class of one flow name; the registry itself is read by its availability()."""
    if not flow.isidentifier():
        raise BackendNotFound(f"{EXT_PREFIX}{flow!r}: a flow name is an identifier, such as ext:xnnpack")
    module_name, _, attr = EXT_FLOWS.partition(":")
    make: Callable[[str], type[Backend]] = getattr(importlib.import_module(module_name), attr)
    return make(flow)


def availability_of(spec: str, cls: type[Backend]) -> Availability:
    """``cls.availability()``, with a probe that raises or returns something else reported as BackendError."""
    try:
        availability = cls.availability()
    except Exception as e:
        raise BackendError(f"backend {spec!r}: availability() raised {one_line(e)}") from e
    if not isinstance(availability, Availability):
        raise BackendError(f"backend {spec!r}: availability() returned {availability!r}, not an Availability")
    return availability


def runtime_availability(cls: type[Backend], availability: Availability) -> Availability:
    """``availability``, unless ``cls.load_runtime()`` raises: then unavailable, with what it raised."""
    if not availability.available:
        return availability
    try:
        cls.load_runtime()
    except Exception as e:
        return Availability(False, f"its runtime cannot be loaded: {one_line(e)}", availability.versions)
    return availability


def package_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
