"""P1-P5 on the user's program, read from the backend's package view."""

from __future__ import annotations

from pytest_ptn.backend import PackageView
from pytest_ptn.check.findings import Finding, Stage
from pytest_ptn.programs.exported import constants_of, mutable_keys, unique_immutable_bytes


def package_findings(view: PackageView, programs: dict) -> list[Finding]:
    """Namespaces (P1, P2), references (P3), dedupe (P4) and state never aliased (P5)."""
    mutable = mutable_keys(programs)
    findings = []
    for method, ep in programs.items():
        for key in constants_of(ep):
            want = f"state/{key}" if key in mutable else f"{method}/{key}"
            got = view.bindings.get(method, {}).get(key)
            if got != want:
                rule = "P2" if key in mutable else "P1"
                findings.append(
                    Finding(rule, Stage.PACKAGE, f"key {key!r} is stored as {got!r}, not {want!r}", method)
                )
    stored = set(view.entries) | set(view.aliases)
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
    unique = unique_immutable_bytes(programs)
    state = sum(view.entries[k].nbytes for k in view.state_keys if k in view.entries)
    total = sum(e.nbytes for e in view.entries.values())
    if total != unique + state:
        findings.append(
            Finding(
                "P4",
                Stage.PACKAGE,
                f"the package stores {total} bytes, not the unique immutable {unique} + state {state}",
            )
        )
    findings += [
        Finding("P5", Stage.PACKAGE, f"state entry aliased: {alias!r} -> {owner!r}")
        for alias, owner in view.aliases.items()
        if alias in view.state_keys or owner in view.state_keys
    ]
    return findings
