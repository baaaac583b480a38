"""P rules: how a package names, stores and shares the constants of a multi-method program."""

from __future__ import annotations

import math
import time

import pytest

from pytest_ptn.harness import Case
from pytest_ptn.programs.exported import constants_of, mutable_keys, unique_immutable_bytes

pytestmark = pytest.mark.ptn_scenarios("valid")

ZIP_TIME_STEP = 2
"""The resolution of a zip member's timestamp, in seconds: stamps in one even-second step are equal."""


@pytest.mark.P1
def test_immutable_constants_live_in_their_method_namespace(ptn_case: Case) -> None:
    view = ptn_case.lower().package()
    programs = ptn_case.exported()
    mutable = mutable_keys(programs)
    wrong = []
    for method, ep in programs.items():
        for key in constants_of(ep):
            final = view.bindings.get(method, {}).get(key)
            if key not in mutable and final != f"{method}/{key}":
                wrong.append(
                    f"method {method!r} key {key!r} is stored as {final!r}, not {method + '/' + key!r}"
                )
    assert not wrong, "\n".join(wrong)


@pytest.mark.P2
def test_mutated_keys_are_one_state_entry(ptn_case: Case) -> None:
    view = ptn_case.lower().package()
    programs = ptn_case.exported()
    wrong = []
    for key in sorted(mutable_keys(programs)):
        final = f"state/{key}"
        if final not in view.state_keys or final not in view.entries:
            wrong.append(f"mutable key {key!r} has no stored state entry {final!r}")
        for method, ep in programs.items():
            bound = view.bindings.get(method, {}).get(key)
            if key in constants_of(ep) and bound != final:
                wrong.append(f"method {method!r} binds mutable key {key!r} to {bound!r}, not {final!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.P3
def test_every_reference_is_rewritten_and_resolves(ptn_case: Case) -> None:
    view = ptn_case.lower().package()
    stored = set(view.entries) | set(view.aliases)
    wrong = []
    referenced = set()
    for ref in view.references:
        referenced.add(ref.name)
        if not (ref.name.startswith(f"{ref.method}/") or ref.name.startswith("state/")):
            wrong.append(f"method {ref.method!r} {ref.where} {ref.name!r} names a pre-namespace key")
        if ref.name not in stored:
            wrong.append(f"method {ref.method!r} {ref.where} {ref.name!r} has no data")
    referenced |= {view.aliases[name] for name in referenced if name in view.aliases}
    wrong += [f"stored entry {name!r} is referenced by no method" for name in sorted(stored - referenced)]
    assert not wrong, "\n".join(wrong)


@pytest.mark.P4
def test_identical_immutable_tensors_are_stored_once(ptn_case: Case) -> None:
    view = ptn_case.lower().package()
    programs = ptn_case.exported()
    unique = unique_immutable_bytes(programs)
    state = sum(view.entries[k].nbytes for k in view.state_keys if k in view.entries)
    stored = sum(e.nbytes for e in view.entries.values())
    assert stored == unique + state, (
        f"package stores {stored} bytes; unique immutable bytes {unique} + state {state} = {unique + state}"
    )
    for method, ep in programs.items():
        for key, use in constants_of(ep).items():
            final = view.bindings[method][key]
            if not final.startswith("state/"):
                assert view.read(final).equal(use.tensor), (
                    f"{final!r} does not hold method {method!r} key {key!r}"
                )


@pytest.mark.P5
def test_state_is_never_an_alias(ptn_case: Case) -> None:
    view = ptn_case.lower().package()
    wrong = [
        f"{alias!r} -> {owner!r}"
        for alias, owner in view.aliases.items()
        if alias in view.state_keys or owner in view.state_keys
    ]
    assert not wrong, f"state entries aliased: {wrong}"


@pytest.mark.P9
def test_lowering_twice_gives_identical_packages(ptn_case: Case) -> None:
    lowered = ptn_case.lower()
    first = lowered.path.read_bytes()
    # A package that embeds the time must show it, whatever the timing of the run: zip stamps members in
    # 2-second steps, so the second lowering starts in a later step than the one the first package ended in.
    written = lowered.path.stat().st_mtime
    next_step = (math.floor(written / ZIP_TIME_STEP) + 1) * ZIP_TIME_STEP
    time.sleep(max(0.0, next_step - time.time() + 0.01))
    second = ptn_case.lower_fresh().path.read_bytes()
    assert first == second, f"two lowerings differ ({len(first)} vs {len(second)} bytes)"
