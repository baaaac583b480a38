"""Deliberately broken variants of the reference backend, one per rule: the suite must catch each.

Every variant breaks its rule the way a real lowering or loader does (the upstream behaviour cited), and
only that rule as far as possible. ``BROKEN`` maps rule id -> variant; tests/test_broken_variants.py runs
the rule's tests against it and expects them to fail.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import time
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from pytest_ptn.backend import Capability, Lowered
from pytest_ptn.backends.reference import ReferenceBackend
from pytest_ptn.instruments import content
from pytest_ptn.reference import package as reference_package
from pytest_ptn.reference import planner
from pytest_ptn.reference.inputs import CallRefused
from pytest_ptn.reference.loader import ReferenceLoaded, ReferenceLowered
from pytest_ptn.reference.package import Package, read_package
from pytest_ptn.reference.planner import ConstantUse, PackagePlan

Uses = Mapping[str, Mapping[str, ConstantUse]]


def _rename(plan: PackagePlan, rename) -> PackagePlan:
    """Apply ``rename(final) -> final`` to every name of a plan; later entries overwrite earlier ones."""
    entries = {rename(k): t for k, t in plan.entries.items()}
    aliases = {rename(a): rename(o) for a, o in plan.aliases.items() if rename(a) != rename(o)}
    for alias in aliases:
        entries.pop(alias, None)
    bindings = {m: {k: rename(f) for k, f in b.items()} for m, b in plan.bindings.items()}
    return PackagePlan(bindings, entries, aliases, frozenset(rename(k) for k in plan.state_keys))


class NotNamespaced(ReferenceBackend):
    """P1: immutable constants keep their pre-namespace key (executorch 1.5.1 to_native)."""

    name = "broken-p1"

    def plan(self, methods: Uses) -> PackagePlan:
        plan = planner.plan_package(methods)
        return _rename(plan, lambda f: f if f.startswith("state/") else f.split("/", 1)[1])


class StatePerMethod(ReferenceBackend):
    """P2: a mutated key is stored once per method instead of once as ``state/k``."""

    name = "broken-p2"

    def plan(self, methods: Uses) -> PackagePlan:
        renamed = {m: {f"{m}@{k}": u for k, u in uses.items()} for m, uses in methods.items()}
        plan = planner.plan_package(renamed)
        bindings = {m: {k.split("@", 1)[1]: f for k, f in b.items()} for m, b in plan.bindings.items()}
        return dataclasses.replace(plan, bindings=bindings)


class OrphanEntry(ReferenceBackend):
    """P3: the package keeps a data entry that nothing references (a leftover pre-namespace copy)."""

    name = "broken-p3"

    def plan(self, methods: Uses) -> PackagePlan:
        plan = planner.plan_package(methods)
        method, uses = next(iter(methods.items()))
        key, use = next(iter(uses.items()), ("x", ConstantUse(torch.zeros(1))))
        plan.entries[key] = use.tensor.clone()
        return plan


class NoDedupe(ReferenceBackend):
    """P4: byte-identical immutable tensors are each stored in full."""

    name = "broken-p4"

    def plan(self, methods: Uses) -> PackagePlan:
        plan = planner.plan_package(methods)
        owners = {**plan.entries}
        for alias, owner in plan.aliases.items():
            owners[alias] = plan.entries[owner].clone()
        return dataclasses.replace(plan, entries=owners, aliases={})


class StateDeduped(ReferenceBackend):
    """P5: a state entry equal in bytes to an immutable one is aliased to it."""

    name = "broken-p5"

    def plan(self, methods: Uses) -> PackagePlan:
        plan = planner.plan_package(methods)
        for s in sorted(plan.state_keys):
            for owner, t in list(plan.entries.items()):
                if owner not in plan.state_keys and content.same_content(t, plan.entries[s]):
                    plan.aliases[s] = owner
                    del plan.entries[s]
                    break
        return plan


class StateMethodAllowed(ReferenceBackend):
    """P6: a method named ``state`` is accepted (its constants land in the state namespace)."""

    name = "broken-p6"

    def plan(self, methods: Uses) -> PackagePlan:
        renamed = {("state-method" if m == "state" else m): u for m, u in methods.items()}
        plan = planner.plan_package(renamed)
        plan.bindings = {("state" if m == "state-method" else m): b for m, b in plan.bindings.items()}
        return plan


class FirstStateWins(ReferenceBackend):
    """P7: conflicting initial values of a mutable key are not checked; the first method's win (pte F10)."""

    name = "broken-p7"

    def plan(self, methods: Uses) -> PackagePlan:
        first: dict[str, ConstantUse] = {}
        for uses in methods.values():
            for k, u in uses.items():
                if u.mutable:
                    first.setdefault(k, u)
        return planner.plan_package(
            {m: {k: first.get(k, u) for k, u in uses.items()} for m, uses in methods.items()}
        )


class LastNameWins(ReferenceBackend):
    """P8: two pairs with one final name are not detected; the later one overwrites the earlier."""

    name = "broken-p8"

    def plan(self, methods: Uses) -> PackagePlan:
        tags = {m: f"#{i}" for i, m in enumerate(methods)}
        plan = planner.plan_package({tags[m]: u for m, u in methods.items()})
        names = {t: m for m, t in tags.items()}

        def rename(final: str) -> str:
            head, _, rest = final.partition("/")
            return f"{names[head]}/{rest}" if head in names else final

        plan = _rename(plan, rename)
        plan.bindings = {names[t]: b for t, b in plan.bindings.items()}
        return plan


class Nondeterministic(ReferenceBackend):
    """P9: each lowering stamps the package with the time it was written."""

    name = "broken-p9"

    def lower(self, programs, workdir: Path) -> Lowered:
        lowered = super().lower(programs, workdir)
        with open(lowered.path, "ab") as f:
            f.write(str(time.time_ns()).encode())
        return lowered


class _WithLoader(ReferenceBackend):
    """A reference backend whose loaded programs are ``loaded``, a broken ReferenceLoaded."""

    loaded: type[ReferenceLoaded] = ReferenceLoaded

    def load(self, lowered: Lowered) -> ReferenceLoaded:
        assert isinstance(lowered, ReferenceLowered)
        return self.loaded(read_package(lowered.path), lowered.graphs, self.cache)


class _KeyedByNameLoaded(ReferenceLoaded):
    """Binds constants program-wide by the key the method uses: the first method to load a key wins."""

    def bind(self, method: str, key: str, final: str) -> torch.Tensor:
        by_key = self.__dict__.setdefault("_by_key", {})
        if key not in by_key:
            by_key[key] = super().bind(method, key, final)
        return by_key[key]


class BindsByKey(_WithLoader):
    """E1: the loader resolves constants by their pre-namespace key, so methods read each other's tensors."""

    name = "broken-e1"

    loaded = _KeyedByNameLoaded


class RejectsCollisions(ReferenceBackend):
    """E2: lowering refuses same-name constants with different bytes (executorch 1.5.1 to_native)."""

    name = "broken-e2"

    def plan(self, methods: Uses) -> PackagePlan:
        seen: dict[str, tuple[str, torch.Tensor]] = {}
        for m, uses in methods.items():
            for k, u in uses.items():
                first = seen.setdefault(k, (m, u.tensor))
                if not content.same_content(first[1], u.tensor):
                    raise ValueError(f"constant {k!r} differs between methods {first[0]!r} and {m!r}")
        return planner.plan_package(methods)


class _StatePerMethodLoaded(ReferenceLoaded):
    def _state_tensor(self, method: str, final: str) -> torch.Tensor:
        copies = self.__dict__.setdefault("_copies", {})
        return copies.setdefault((method, final), self._state[final].clone())


class StateCopiedPerMethod(_WithLoader):
    """E3: every method gets its own copy of shared state (the legacy ExecuTorch Module API)."""

    name = "broken-e3"

    loaded = _StatePerMethodLoaded


class _WritesReturnedLoaded(ReferenceLoaded):
    def run(self, method: str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        before = {k: t.clone() for k, t in self.state().items()}
        outputs = super().run(method, inputs)
        written = [t.clone() for k, t in self.state().items() if not torch.equal(t, before[k])]
        return [*written, *outputs]


class WritesReturned(_WithLoader):
    """E1: each state write also comes back as an extra first output (to_native, a buffer written with
    copy_ and never read: its mutation output becomes a user output)."""

    name = "broken-writes-returned"

    loaded = _WritesReturnedLoaded


class _ArenaLoaded(ReferenceLoaded):
    def _initial_state(self) -> dict[str, torch.Tensor]:
        arena: dict[tuple, torch.Tensor] = {}
        state = super()._initial_state()
        return {k: arena.setdefault((t.dtype, tuple(t.shape)), t) for k, t in state.items()}


class SharedArena(_WithLoader):
    """E4: state buffers of one shape share one arena slot (executorch Runtime.load_program, pte F8)."""

    name = "broken-e4"

    loaded = _ArenaLoaded


class _ZeroStateLoaded(ReferenceLoaded):
    def _initial_state(self) -> dict[str, torch.Tensor]:
        return {k: torch.zeros_like(t) for k, t in super()._initial_state().items()}


class ZeroInitState(_WithLoader):
    """E5: buffers start zero-filled instead of from their eager values (to_native non-persistent buffers)."""

    name = "broken-e5"

    loaded = _ZeroStateLoaded


class _InexactLoaded(ReferenceLoaded):
    """Every floating value a graph computes (outputs and the state it writes alike) comes out 6% high."""

    def __init__(
        self, package: Package, graphs: Mapping[str, torch.fx.GraphModule], cache: content.SharingCache
    ):
        super().__init__(package, {m: _Inexact(g) for m, g in graphs.items()}, cache)


class _Inexact:
    """A graph whose floating results are 6% high."""

    def __init__(self, module: torch.fx.GraphModule):
        self.module = module

    def __getattr__(self, name: str) -> object:
        return getattr(self.module, name)

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        return [t * (1 + 2**-4) if t.is_floating_point() else t for t in self.module(*args)]


class InexactKernels(_WithLoader):
    """A1: kernels whose floating results are 6% off eager's (a low-precision accumulator, a bad fused
    kernel): the method alone computes them so too, so it is accuracy and never an isolation failure."""

    name = "broken-a1"

    loaded = _InexactLoaded


class _Loader(ReferenceBackend):
    """A reference backend whose loader shares through ``make_cache()`` instead of a SharingCache."""

    def make_cache(self):
        raise NotImplementedError

    def load(self, lowered: Lowered) -> ReferenceLoaded:
        assert isinstance(lowered, ReferenceLowered)
        if "_broken_cache" not in self.__dict__:
            self._broken_cache = self.make_cache()
        return ReferenceLoaded(read_package(lowered.path), lowered.graphs, self._broken_cache)


class _NoCache:
    def share(self, host, materialize):
        return materialize(host)


class NoSharing(_Loader):
    """S1: every method materializes its own copy of an identical constant."""

    name = "broken-s1"

    def make_cache(self):
        return _NoCache()


class _MetadataCache:
    """Keyed by metadata only, as the CUDA delegate compares (executorch PR #21959)."""

    def __init__(self):
        self._tensors = {}

    def share(self, host, materialize):
        key = (host.dtype, tuple(host.shape), tuple(host.stride()))
        if key not in self._tensors:
            self._tensors[key] = materialize(host)
        return self._tensors[key]


class MetadataOnly(_Loader):
    """S2: constants that agree on dtype, shape and strides are shared whatever their bytes."""

    name = "broken-s2"

    def make_cache(self):
        return _MetadataCache()


class _TrustsNamesLoaded(ReferenceLoaded):
    """Skips the content check for a method whose every key was loaded before (CUDA delegate 'all cached')."""

    def load_method(self, method: str) -> None:
        if method in self._bound:
            return
        by_key = self.__dict__.setdefault("_by_key", {})
        items = self._constants(method)
        immutable = [i for i in items if i["final"] not in self._state]
        if immutable and all(i["key"] in by_key for i in immutable):
            self._bound[method] = {i["final"]: by_key[i["key"]] for i in immutable}
            return
        super().load_method(method)
        for i in immutable:
            by_key.setdefault(i["key"], self._bound[method][i["final"]])


class TrustsCachedNames(_WithLoader):
    """S3: no check at all when every constant name of a later method is already cached."""

    name = "broken-s3"

    loaded = _TrustsNamesLoaded


PROCESS_WIDE: dict[str, torch.Tensor] = {}
"""ProcessWideByName's constants, by final name: module-level, as long-lived as the process, never cleared."""


class _ProcessWideLoaded(ReferenceLoaded):
    def bind(self, method: str, key: str, final: str) -> torch.Tensor:
        if final not in PROCESS_WIDE:
            PROCESS_WIDE[final] = super().bind(method, key, final)
        return PROCESS_WIDE[final]


class ProcessWideByName(_WithLoader):
    """S4: a process-wide cache keyed by name, never cleared: a second program reads the first's constants."""

    name = "broken-s4"

    loaded = _ProcessWideLoaded


class _InstanceWideLoaded(ReferenceLoaded):
    def bind(self, method: str, key: str, final: str) -> torch.Tensor:
        cache = self.__dict__["by_name"]
        if final not in cache:
            cache[final] = super().bind(method, key, final)
        return cache[final]


class InstanceWideByName(_WithLoader):
    """S4 as the ExecuTorch CUDA delegate breaks it: a cache keyed by name, as long-lived as its backend
    object (one per process there) and never cleared: every later program reads the first one's constants."""

    name = "broken-s4-instance"

    def __init__(self) -> None:
        super().__init__()
        self.by_name: dict[str, torch.Tensor] = {}

    def load(self, lowered: Lowered) -> ReferenceLoaded:
        loaded = super().load(lowered)
        loaded.__dict__["by_name"] = self.by_name
        return loaded

    loaded = _InstanceWideLoaded


RUNTIME_CACHE: dict[str, torch.Tensor] = {}
"""ExecuteOnlyByName's constants, by the name its runtime gives them: module-level, as long-lived as the
process, never cleared."""


class _RuntimeNamesLoaded(ReferenceLoaded):
    def bind(self, method: str, key: str, final: str) -> torch.Tensor:
        name = key.rsplit(".", 1)[-1]
        if name not in RUNTIME_CACHE:
            RUNTIME_CACHE[name] = super().bind(method, key, final)
        return RUNTIME_CACHE[name]


class ExecuteOnlyByName(_WithLoader):
    """E1 as a runtime's own per-process cache breaks it (the ExecuTorch CUDA delegate's, by name, per
    process): constants keyed by the name the runtime sees (the key's last part), in a module-level dict never
    cleared, and no view declared but EXECUTE. Only a truth that shares nothing with the program's run (each
    method alone in a fresh process) tells its wrong values from arithmetic."""

    name = "broken-e1-runtime"
    capabilities = frozenset({Capability.EXECUTE})

    loaded = _RuntimeNamesLoaded


class _OrderedLoaded(ReferenceLoaded):
    """Shares only with methods that loaded earlier and sort before the current one."""

    def bind(self, method: str, key: str, final: str) -> torch.Tensor:
        local = self.__dict__.setdefault("_local", {})
        host = self.package_tensor(final)
        key = content.ContentKey.of(host)
        for (other, other_key), t in local.items():
            if other < method and other_key == key:
                return t
        return local.setdefault((method, key), self.allocate(host))


class OrderDependent(_WithLoader):
    """S5: whether constants are shared depends on which method loads first."""

    name = "broken-s5"

    loaded = _OrderedLoaded


class _ReuploadLoaded(ReferenceLoaded):
    """Uploads every constant to compare it with the cache, then frees the copy on a hit (PR #21959's
    first attempt, which ran out of CUDA memory)."""

    def bind(self, method: str, key: str, final: str) -> torch.Tensor:
        uploaded = self.allocate(self.package_tensor(final))
        shared = self._cache.share(uploaded, lambda t: t)
        if shared is not uploaded:
            self._allocated -= uploaded.numel() * uploaded.element_size()
        return shared


class ReuploadToCompare(_WithLoader):
    """S6: the sharing check allocates a device copy of each constant before deciding."""

    name = "broken-s6"

    loaded = _ReuploadLoaded


class _RacyCache(content.SharingCache):
    """Looks up, yields, then inserts without looking again: concurrent loads each miss."""

    def share(self, host, materialize=torch.clone):
        key = content.ContentKey.of(host)
        cached = self._tensors.get(key)
        if cached is None:
            time.sleep(0.05)
            cached = self._tensors[key] = materialize(host)
        return cached


class ThreadUnsafe(_Loader):
    """S7: the cache has a check-then-insert race, so threads loading at once each make their own copy."""

    name = "broken-s7"

    def make_cache(self):
        return _RacyCache()


class _RarelyRacyCache(content.SharingCache):
    """The race of _RacyCache, but only when the thread that misses pauses between look-up and insert, as
    about one look-up of seven does (20 ms): S7's 16 concurrent loads of a case catch it in about half the
    runs."""

    def share(self, host, materialize=torch.clone):
        key = content.ContentKey.of(host)
        cached = self._tensors.get(key)
        if cached is None:
            if random.random() < 1 / 7:
                time.sleep(0.02)
            cached = self._tensors[key] = materialize(host)
        return cached


class RarelyThreadUnsafe(_Loader):
    """S7 by chance: a case's concurrent loads race in some runs only (not in BROKEN: a baseline test's)."""

    name = "broken-s7-rarely"

    def make_cache(self):
        return _RarelyRacyCache()


class VagueErrors(ReferenceBackend):
    """X1: rejections say that something is wrong but not which method or key."""

    name = "broken-x1"

    def plan(self, methods: Uses) -> PackagePlan:
        try:
            return planner.plan_package(methods)
        except planner.PackagingError as e:
            raise ValueError("invalid program") from e


BROKEN: dict[str, type[ReferenceBackend]] = {
    "P1": NotNamespaced,
    "P2": StatePerMethod,
    "P3": OrphanEntry,
    "P4": NoDedupe,
    "P5": StateDeduped,
    "P6": StateMethodAllowed,
    "P7": FirstStateWins,
    "P8": LastNameWins,
    "P9": Nondeterministic,
    "E1": BindsByKey,
    "E2": RejectsCollisions,
    "E3": StateCopiedPerMethod,
    "E4": SharedArena,
    "E5": ZeroInitState,
    "S1": NoSharing,
    "S2": MetadataOnly,
    "S3": TrustsCachedNames,
    "S4": ProcessWideByName,
    "S5": OrderDependent,
    "S6": ReuploadToCompare,
    "S7": ThreadUnsafe,
    "X1": VagueErrors,
    "A1": InexactKernels,
}


class _TrustingLowered(ReferenceLowered):
    """Reads the package the way a first draft does: no size, header or alias-map checks at all."""

    def package(self):
        from safetensors.torch import load

        with zipfile.ZipFile(self.path) as z:
            data = z.read(reference_package.DATA)
            aliases = json.loads(z.read(reference_package.ALIASES))
            bindings = json.loads(z.read(reference_package.BINDINGS))
        header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
        state_keys = json.loads(header.get("__metadata__", {}).get("state_keys", "[]"))
        return reference_package.view(Package(load(data), aliases, bindings, state_keys))


class TrustingReader(ReferenceBackend):
    """X2: the package reader trusts the file: a damaged package gives BadZipFile, SafetensorError,
    KeyError or a silently wrong view instead of a clear ValueError."""

    name = "broken-x2"

    def lower(self, programs, workdir: Path) -> ReferenceLowered:
        lowered = super().lower(programs, workdir)
        assert isinstance(lowered, ReferenceLowered)
        return _TrustingLowered(lowered.path, lowered.graphs)


class InPlaceSave(ReferenceBackend):
    """P10: the package is written directly at its final path, so a save that fails part-way leaves a
    truncated package where the good one was."""

    name = "broken-p10"

    def lower(self, programs, workdir: Path) -> ReferenceLowered:
        """ReferenceBackend.lower with the zip written straight to ``program.ptpkg``."""
        from pytest_ptn.programs.exported import constants_of, functionalize, signature

        decomposed = functionalize(programs)
        plan = self.plan({m: constants_of(ep) for m, ep in decomposed.items()})
        bindings = {m: signature(ep, plan.bindings[m]) for m, ep in decomposed.items()}
        package = Package(plan.entries, plan.aliases, bindings, sorted(plan.state_keys))
        path = workdir / "program.ptpkg"
        with open(path, "wb") as f:
            reference_package.write_zip(f, package)
        return ReferenceLowered(path, {m: ep.graph_module for m, ep in decomposed.items()})


BROKEN["X2"] = TrustingReader
BROKEN["P10"] = InPlaceSave


class _ReinitOnLoadLoaded(ReferenceLoaded):
    """Every method load copies the method's initial values into the state the program shares again
    (executorch 1.5.1 ``load_method`` with ``share_mutable_buffers``): harmless when every method loads
    before the first call."""

    def load_method(self, method: str) -> None:
        if method not in self._bound:
            for item in self._constants(method):
                if item["final"] in self._state:
                    self._state[item["final"]].copy_(self.package_tensor(item["final"]))
        super().load_method(method)


class ReinitOnLateLoad(_WithLoader):
    """E1/E3 under the at-first-call schedule only: a method loaded after another ran resets shared state."""

    name = "broken-late-load"

    loaded = _ReinitOnLoadLoaded


class _UsedNamesOnlyLoaded(ReferenceLoaded):
    """Allocates only the first FQN of an aliased tensor (AOTInductor never allocates the unused names): the
    storage of a second name is an identity of its own."""

    def storage(self, method: str, key: str) -> int:
        if key.startswith("rope."):
            return id(self) + hash(key)
        return super().storage(method, key)


class UsedNamesOnly(_WithLoader):
    """Correct, but shows no storage for a tensor's second FQN: no S1 may be reported for it."""

    name = "used-names-only"

    loaded = _UsedNamesOnlyLoaded


class _DtypeBlindCache:
    """Keyed by shape and bytes; the dtype is left out."""

    def __init__(self):
        self._tensors = {}

    def share(self, host, materialize):
        key = (tuple(host.shape), content.digest(host))
        if key not in self._tensors:
            self._tensors[key] = materialize(host)
        return self._tensors[key]


class DtypeBlindDedupe(_Loader):
    """S2/E1 on lookalike content: immutable constants deduped by their bytes alone (the dedupe of
    executorch #23891 keyed without the dtype), so zeros of two dtypes, or a float32 tensor and the int32
    one holding its bit patterns, become one tensor."""

    name = "broken-dtype-blind"

    def make_cache(self):
        return _DtypeBlindCache()


PREFIX_BYTES = 1024
"""What PrefixDigestCache hashes of a constant."""


class _PrefixDigestCache:
    """Keyed by dtype, shape and a digest of the first PREFIX_BYTES bytes."""

    def __init__(self):
        self._tensors = {}

    def share(self, host, materialize):
        prefix = content.tensor_bytes(host)[:PREFIX_BYTES]
        key = (host.dtype, tuple(host.shape), hashlib.sha256(prefix).hexdigest())
        if key not in self._tensors:
            self._tensors[key] = materialize(host)
        return self._tensors[key]


class PrefixDigestCache(_Loader):
    """S2/E1 on lookalike content: weights keyed by a digest of their first KiB (#21823 keys weights by a
    digest of their bytes; hashing a prefix to save time on large ones), so two long weights that differ
    only near the end are shared."""

    name = "broken-prefix-digest"

    def make_cache(self):
        return _PrefixDigestCache()


class _ClosenessCache:
    """Shares a constant with one cached before of the same dtype and shape that is allclose to it."""

    tolerance = 1e-2
    """rtol and atol of the closeness test."""

    def __init__(self):
        self._cached = []

    def share(self, host, materialize):
        tol = self.tolerance
        for seen, tensor in self._cached:
            same_meta = seen.dtype == host.dtype and seen.shape == host.shape
            if same_meta and torch.allclose(seen.double(), host.double(), rtol=tol, atol=tol):
                return tensor
        tensor = materialize(host)
        self._cached.append((host, tensor))
        return tensor


class ClosenessDedupe(_Loader):
    """S2/E1 on lookalike content: constants deduped by closeness (torch.allclose, rtol=atol=1e-2) rather
    than equal bytes, as if a fine-tuned weight were its base one (the content dedupe of executorch #23891
    loosened to tolerate rounding), so near-equal weights are shared."""

    name = "broken-closeness"

    def make_cache(self):
        return _ClosenessCache()


class _UncheckedInputsLoaded(ReferenceLoaded):
    """Runs whatever a call passes: no check of the inputs against the method's exported signature."""

    def _admits(self, method, inputs):
        return None


class UncheckedInputs(_WithLoader):
    """X1 on calls: a call with inputs of another count, dtype or shape runs (broadcast, cast by torch) or
    fails deep in a kernel, never refused naming the method."""

    name = "broken-x1-inputs"

    loaded = _UncheckedInputsLoaded


class _FlagStrictLowered(ReferenceLowered):
    """Refuses a package any of whose zip members has a general purpose flag bit set, before reading it."""

    def package(self):
        with zipfile.ZipFile(self.path) as z:
            flagged = [(i.filename, i.flag_bits) for i in z.infolist() if i.flag_bits]
        if flagged:
            name, bits = flagged[0]
            raise ValueError(
                f"{self.path}: zip member {name!r} sets flag bits {bits:#x}, refused as unsupported"
            )
        return super().package()


class RefusesZipFlags(ReferenceBackend):
    """X2's other side: the reader takes every zip flag bit for damage (a check of ``flag_bits != 0``
    rather than of the bits a package never uses), so a valid package written by a zip writer that adds a
    data descriptor or flags its names as UTF-8 is refused."""

    name = "broken-x2-flags"

    def lower(self, programs, workdir: Path) -> ReferenceLowered:
        lowered = super().lower(programs, workdir)
        assert isinstance(lowered, ReferenceLowered)
        return _FlagStrictLowered(lowered.path, lowered.graphs)


WHOLE_CHUNK = 1024 * 1024


class _WholeChunksLowered(ReferenceLowered):
    """Reads a tensor a 1 MiB chunk at a time but only whole chunks: a tail past the last whole one is left
    as the fresh allocation held it (zeros here)."""

    def package(self):
        view = super().package()

        def read(name: str) -> torch.Tensor:
            t = view.read(name).clone()
            whole = t.nbytes // WHOLE_CHUNK * WHOLE_CHUNK
            if WHOLE_CHUNK <= whole < t.nbytes:
                content.host_memory(t)[whole:] = bytes(t.nbytes - whole)
            return t

        return dataclasses.replace(view, read=read)


class DropsChunkTails(ReferenceBackend):
    """P4 at a real model's size: a package reader whose chunked copy drops a large tensor's last partial
    chunk, which no tensor of the catalogue's small programs (each under one chunk, or whole chunks) has."""

    name = "broken-p4-chunks"

    def lower(self, programs, workdir: Path) -> ReferenceLowered:
        lowered = super().lower(programs, workdir)
        assert isinstance(lowered, ReferenceLowered)
        return _WholeChunksLowered(lowered.path, lowered.graphs)


class _TracedShapesLoaded(ReferenceLoaded):
    """Takes each input only at the shape its method was traced with: a dynamic dimension is held to its
    example size, as a runtime that plans memory for the traced shapes alone does."""

    def _admits(self, method, inputs):
        super()._admits(method, inputs)
        graph = self._graphs[method]
        items = self._package.bindings[method]["inputs"]
        traced = [
            tuple(int(s.node.hint) if isinstance(s, torch.SymInt) else s for s in node.meta["val"].shape)
            for node, item in zip(graph.graph.find_nodes(op="placeholder"), items, strict=True)
            if item["kind"] == "user"
        ]
        for i, (given, shape) in enumerate(zip(inputs, traced, strict=False)):
            if tuple(given.shape) != shape:
                raise CallRefused(
                    f"method {method!r} takes input {i} as shape {shape}, not {tuple(given.shape)}"
                )


class TracedShapesOnly(_WithLoader):
    """E1 over a dynamic dimension: a call at any size but the one the method was traced at is refused."""

    name = "broken-e1-traced-shapes"

    loaded = _TracedShapesLoaded
