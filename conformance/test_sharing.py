"""S rules: a loader shares what is identical across methods, and only that."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pytest_ptn.backend import Loaded
from pytest_ptn.check.earlier import EarlierPrograms
from pytest_ptn.check.explain import Replay
from pytest_ptn.check.findings import Finding
from pytest_ptn.check.storage import (
    concurrent_change,
    partition,
    shared_differing_findings,
    split_identical_findings,
    topology,
)
from pytest_ptn.harness import Case, fail_on, fail_with
from pytest_ptn.instruments.comparison import equal
from pytest_ptn.mechanisms import Kind, Mechanism
from pytest_ptn.programs.exported import (
    immutable_by_content,
    unique_immutable_bytes,
)


def _fail_with(case: Case, findings: list[Finding], rule: str | None = None) -> None:
    """Fail with ``findings``, their mechanisms the case's (the causes group by them), each told as breaking
    ``rule`` where given: a pair shared across a total collision breaks S2 and S3 alike, and an S2 test
    says S2."""
    case.found.extend(m for f in findings for m in f.mechanisms)
    fail_with([str(dataclasses.replace(f, rule=rule) if rule else f) for f in findings])


def _load_all(case: Case, order: list[str] | None = None) -> Loaded:
    loaded = case.load()
    for method in order or case.program.method_names:
        loaded.load_method(method)
    return loaded


@pytest.mark.S1
@pytest.mark.ptn_scenarios("dedupe")
def test_identical_constants_share_one_allocation(ptn_case: Case) -> None:
    programs = ptn_case.exported()
    storages = topology(_load_all(ptn_case), programs)
    _fail_with(ptn_case, split_identical_findings(storages, immutable_by_content(programs)))


def _never_shared(case: Case) -> None:
    """S2: no two constants of different content (dtype, shape and every byte) in one allocation, and
    every output as eager's."""
    programs = case.exported()
    storages = topology(_load_all(case), programs)
    _fail_with(case, shared_differing_findings(storages, immutable_by_content(programs)), "S2")
    fail_on(case.run_sequence(case.load()), "outputs differ from eager")


@pytest.mark.S2
@pytest.mark.ptn_scenarios("collision")
def test_same_name_different_content_is_never_shared(ptn_case: Case) -> None:
    _never_shared(ptn_case)


@pytest.mark.S2
@pytest.mark.ptn_scenarios("lookalike")
def test_lookalike_content_is_never_shared(ptn_case: Case) -> None:
    """S2 where only content differs, and only a little (catalogue.LOOKALIKE): zeros of two dtypes, a few
    elements past the first KiB, one byte pattern under two dtypes. Its own test, as ptn_scenarios picks
    scenarios carrying every tag it names."""
    _never_shared(ptn_case)


@pytest.mark.S3
@pytest.mark.ptn_scenarios("total_collision")
def test_later_method_with_every_name_cached_is_still_checked(ptn_case: Case) -> None:
    programs = ptn_case.exported()
    loaded = _load_all(ptn_case)
    storages = topology(loaded, programs)
    _fail_with(ptn_case, shared_differing_findings(storages, immutable_by_content(programs)), "S3")
    fail_on(ptn_case.run_sequence(loaded), "outputs differ from eager after loading every method")


@pytest.mark.S4
@pytest.mark.ptn_scenarios("collision")
def test_two_programs_in_one_process_do_not_leak(
    ptn_case: Case, tmp_path_factory: pytest.TempPathFactory
) -> None:
    first = _load_all(ptn_case)
    fail_on(ptn_case.run_sequence(first), "first program differs from eager")
    other = ptn_case.program.with_other_values()
    lowered = ptn_case.backend.lower(other.export(), tmp_path_factory.mktemp("other"))
    second = ptn_case.loader.load(lowered)  # the instance the first program loaded through
    calls = other.eager()
    mismatches = []
    leaked: list[Replay] | None = None
    for i, call in enumerate(calls):
        got = second.run(call.method, [t.clone() for t in call.inputs])
        bounds = zip(got, call.outputs, call.output_bounds(), strict=False)
        if len(got) != len(call.outputs) or not all(equal(g, w, wide) for g, w, wide in bounds):
            said = f"call #{i} {call.method}() of the second program reads the first program's data"
            if leaked is None:  # the evidence, made once: the first program's tensors bound by name
                earlier = EarlierPrograms()
                earlier.add(ptn_case.program.export)
                sequence = [(c.method, c.inputs) for c in calls]
                leaked = earlier.replays(other.export(), set(other.state_fqns()), sequence)
            giving = [r for r in leaked if r.error is None and _same_values(got, r.outputs[i])]
            if giving:
                said += f": it equals {giving[0].label}"
                ptn_case.found.extend(giving[0].mechanisms)
            else:
                ptn_case.found.append(Mechanism(Kind.CROSS_PROGRAM, None, f"call #{i} {call.method}()"))
            mismatches.append(said)
    fail_with(mismatches)


def _same_values(have: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    return len(have) == len(want) and all(equal(h, w) for h, w in zip(have, want, strict=True))


@pytest.mark.S5
@pytest.mark.ptn_scenarios("valid")
def test_load_order_does_not_matter(ptn_case: Case) -> None:
    programs = ptn_case.exported()
    names = list(ptn_case.program.method_names)
    forward, backward = _load_all(ptn_case, names), _load_all(ptn_case, names[::-1])
    assert partition(topology(forward, programs)) == partition(topology(backward, programs)), (
        "sharing topology depends on the order methods load in"
    )
    fail_on(ptn_case.run_sequence(backward), "outputs differ from eager when methods load in reverse order")


@pytest.mark.S6
@pytest.mark.ptn_scenarios("dedupe")
def test_sharing_check_costs_no_memory(ptn_case: Case) -> None:
    backend = type(ptn_case.backend)()  # an empty cache: every unique constant is paid for once
    programs = ptn_case.exported()
    loaded = backend.load(ptn_case.lower())
    for method in programs:
        loaded.load_method(method)
    reading = loaded.constant_memory()
    unique = unique_immutable_bytes(programs)
    if reading.peak_bytes > unique * 1.05 + reading.resolution:
        said = (
            f"peak constant memory {reading.peak_bytes} B is {reading.peak_bytes / max(unique, 1):.2f}x the "
            f"{unique} unique constant bytes ({reading.probe}; resolution {reading.resolution} B)"
        )
        ptn_case.found.append(Mechanism(Kind.MEMORY_PENALTY, None, said))
        pytest.fail(said, pytrace=False)


@pytest.mark.S7
@pytest.mark.ptn_scenarios("dedupe")
def test_concurrent_loads_give_the_same_topology(ptn_case: Case) -> None:
    programs = ptn_case.exported()
    sequential = partition(topology(_load_all(ptn_case), programs))
    changed = concurrent_change(ptn_case.backend, ptn_case.lower(), programs, sequential)
    assert changed is None, changed
