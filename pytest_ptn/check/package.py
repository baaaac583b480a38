"""P1-P5 on a program's package view: check_program's findings, and the conformance P tests' verdicts; and
the package as evidence of how a wrong value came about (``bound_elsewhere``), which the scenario tests, the
fuzz and check_program ask alike."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from pytest_ptn.backend import Entry, PackageView
from pytest_ptn.check.findings import Finding, Stage
from pytest_ptn.mechanisms import Kind, Mechanism, Role
from pytest_ptn.programs.exported import constants_of, mutable_keys, unique_immutable_bytes

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def package_findings(view: PackageView, programs: dict) -> list[Finding]:
    """Namespaces (P1, P2), references (P3), dedupe (P4) and state never aliased (P5)."""
    return [
        *namespace_findings(view, programs),
        *reference_findings(view),
        *dedupe_findings(view, programs),
        *state_alias_findings(view),
    ]


def namespace_findings(view: PackageView, programs: dict) -> list[Finding]:
    """Every immutable key of a method bound to ``method/key`` (P1); every mutated key stored once as
    ``state/key`` and bound to it by every method that binds it (P2)."""
    mutable = mutable_keys(programs)
    findings = [
        Finding("P2", Stage.PACKAGE, f"mutable key {key!r} has no stored state entry 'state/{key}'")
        for key in sorted(mutable)
        if f"state/{key}" not in view.state_keys or f"state/{key}" not in view.entries
    ]
    for method, ep in programs.items():
        for key in constants_of(ep):
            want = f"state/{key}" if key in mutable else f"{method}/{key}"
            got = view.bindings.get(method, {}).get(key)
            if got != want:
                rule = "P2" if key in mutable else "P1"
                findings.append(
                    Finding(rule, Stage.PACKAGE, f"key {key!r} is stored as {got!r}, not {want!r}", method)
                )
    return findings


def reference_findings(view: PackageView) -> list[Finding]:
    """P3: every reference names a namespaced key that has data, and every stored entry is referenced."""
    stored = set(view.entries) | set(view.aliases)
    findings = []
    referenced = set()
    for ref in view.references:
        referenced.add(ref.name)
        if not ref.name.startswith((f"{ref.method}/", "state/")):
            findings.append(
                Finding(
                    "P3", Stage.PACKAGE, f"{ref.where} {ref.name!r} names a pre-namespace key", ref.method
                )
            )
        if ref.name not in stored:
            findings.append(Finding("P3", Stage.PACKAGE, f"{ref.where} {ref.name!r} has no data", ref.method))
    referenced |= {view.aliases[name] for name in referenced if name in view.aliases}
    findings += [
        Finding("P3", Stage.PACKAGE, f"stored entry {name!r} is referenced by no method")
        for name in sorted(stored - referenced)
    ]
    return findings


def dedupe_findings(view: PackageView, programs: dict) -> list[Finding]:
    """P4: the package stores the unique immutable bytes plus the state bytes, nothing more."""
    unique = unique_immutable_bytes(programs)
    state = sum(view.entries[k].nbytes for k in view.state_keys if k in view.entries)
    total = sum(e.nbytes for e in view.entries.values())
    if total == unique + state:
        return []
    detail = f"the package stores {total} bytes, not the unique immutable {unique} + state {state}"
    return [Finding("P4", Stage.PACKAGE, detail)]


def state_alias_findings(view: PackageView) -> list[Finding]:
    """P5: no state entry is an alias or aliased."""
    return [
        Finding("P5", Stage.PACKAGE, f"state entry aliased: {alias!r} -> {owner!r}")
        for alias, owner in view.aliases.items()
        if alias in view.state_keys or owner in view.state_keys
    ]


def bound_elsewhere(
    view: PackageView,
    exports: Mapping[str, ExportedProgram],
    wrong: Iterable[tuple[int, str, Callable[[str], bool]]],
) -> dict[int, tuple[Mechanism, ...]]:
    """For each wrong value (``wrong``: its call, the call's method, and whether a key may be what it read):
    the tensors of its method the package binds, by name, to a stored tensor of another dtype or shape than
    the method's own that another method binds too (a scalar lowering lifted as ``_lifted_tensor_constant0``,
    the name of a method's own buffer), as the package itself says; one no other method binds is that
    method's own layout, not another's tensor. No replay can bind them: the method's graph refuses a tensor
    of another dtype. One of the same dtype and shape but other bytes is another method's, which the replays
    already bind."""
    out: dict[int, tuple[Mechanism, ...]] = {}
    for call, method, may_read in wrong:
        own, buffers = constants_of(exports[method]), set(exports[method].graph_signature.buffers)
        found = []
        for key, final in sorted(view.bindings.get(method, {}).items()):
            entry, use = view.entries.get(view.aliases.get(final, final)), own.get(key)
            if entry is None or use is None or use.mutable or not may_read(key):
                continue
            others = [
                f"{m}()"
                for m, keys in sorted(view.bindings.items())
                if m != method and final in keys.values()
            ]
            mine = Entry.of(use.tensor)
            if others and (entry.dtype, entry.shape) != (mine.dtype, mine.shape):
                found.append(
                    Mechanism(
                        Kind.BY_NAME,
                        Role.BUFFER if key in buffers else Role.CONSTANT,
                        f"the package binds {key!r} of {method}() to {final!r}, a {entry.dtype} tensor of "
                        f"shape {entry.shape} also bound by {', '.join(others)}",
                    )
                )
        if found:
            out[call] = tuple(found)
    return out
