"""``--ptn-repro DIR``: a failing case's bundle replays its failure outside the run; a passing case has none.

Cheap on purpose: the broken E1 reference variant on two small scenarios, one subprocess for ``repro.py``,
and one small ``.pte`` lowering whose ``executorch.runtime`` snippet runs in this process.
"""

from __future__ import annotations

import json
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from broken_backends import BindsByKey

from pytest_ptn import upstream_noise
from pytest_ptn.backends import pte_replay
from pytest_ptn.harness import Case
from pytest_ptn.plugin import suite_path
from pytest_ptn.programs.catalogue import BY_NAME
from pytest_ptn.reporting import repro

FAILING = "same_metadata_different_bytes"
PASSING = "colliding_scalars"


def run_script(path: Path) -> object:
    """Run a script here as ``python path`` would (executorch's import-time warnings kept out of this
    project's ``filterwarnings = error``); its exit status."""
    with upstream_noise.contained(), pytest.raises(SystemExit) as exited:
        runpy.run_path(str(path), run_name="__main__")
    return exited.value.code


def test_a_failing_case_bundle_replays_its_failure_in_a_fresh_folder(
    pytester: pytest.Pytester, warm_torch: None
) -> None:
    result = pytester.runpytest_inprocess(
        str(suite_path()),
        "--ptn-backend=broken_backends:BindsByKey",
        "-k",
        f"test_each_method_matches_eager and ({FAILING}-up_front] or {PASSING}-up_front])",
        "-p",
        "no:cacheprovider",
        repro.OPTION,
        "bundles",
    )
    result.assert_outcomes(failed=1, passed=1)
    bundles = sorted((pytester.path / "bundles").iterdir())
    assert [b.name for b in bundles] == [f"broken_backends_BindsByKey-{FAILING}"]  # none for the passing case
    bundle = bundles[0]
    failure = (bundle / repro.FAILURE).read_text()
    mismatch_lines = [line.strip() for line in failure.splitlines() if line.strip().startswith("call #")]
    assert mismatch_lines and "it read method 'prefill''s 'weight'" in mismatch_lines[0]
    assert json.loads((bundle / repro.MANIFEST).read_text())[repro.ARTIFACT] == {"path": "program.ptpkg"}
    assert "def test_reproducer" in (bundle / repro.PROGRAM_TEST).read_text()

    fresh = shutil.copytree(bundle, pytester.path / "elsewhere" / "bundle")
    shutil.rmtree(bundle)  # nothing of the run is left to lean on
    replay = subprocess.run(
        [sys.executable, repro.REPRO_SCRIPT], cwd=fresh, capture_output=True, text=True, timeout=240
    )
    assert replay.returncode == 1, replay.stdout + replay.stderr
    printed = [line.strip() for line in replay.stdout.splitlines()]
    assert printed[: len(mismatch_lines) + 1] == ["outputs differ from eager:", *mismatch_lines], (
        replay.stdout
    )
    # the storage defect behind it, which a replay of the calls alone would not show
    topology = printed[len(mismatch_lines) + 1 :]
    assert topology[0] == "the loader's sharing topology is wrong:", replay.stdout
    assert "method 'decode': key 'weight' shares storage with method 'prefill''s 'weight'" in topology[1]

    # repro.py loads the bundled file, not the new lowering it makes for the backend's in-memory part
    case = Case(BindsByKey(), BY_NAME[FAILING], lambda name: pytester.path)
    assert repro.bundled_lowered(case, fresh).path == fresh / repro.ARTIFACT / "program.ptpkg"


def test_bundles_of_sharing_and_fuzz_failures_fail_and_are_never_collected(
    pytester: pytest.Pytester, warm_torch: None
) -> None:
    """An S-rule failure's bundle shows the storage defect and exits 1; the fuzz test's failure gets a bundle
    of each program it failed on; a later run in the same folder collects nothing of the bundles."""
    args = [
        str(suite_path()),
        "--ptn-backend=broken_backends:BindsByKey",
        "-k",
        "test_same_name_different_content_is_never_shared and total_collision] or test_generated_programs",
        "-p",
        "no:cacheprovider",
        repro.OPTION,
        "bundles",
    ]
    first = pytester.runpytest_inprocess(*args)
    first.assert_outcomes(failed=2)
    bundles = ["broken_backends_BindsByKey-fuzz", "broken_backends_BindsByKey-total_collision"]
    written = {b.name for b in (pytester.path / "bundles").iterdir()} - set(bundles)
    assert not {n for n in written if not re.fullmatch(r"broken_backends_BindsByKey-fuzz-\d+", n)}, written
    for name in bundles:  # a bundle per unlisted mechanism of the fuzz: its first one replayed here
        replayed = subprocess.run(
            [sys.executable, repro.REPRO_SCRIPT],
            cwd=pytester.path / "bundles" / name,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert replayed.returncode == 1, replayed.stdout + replayed.stderr
    # the folder's own run (no paths: this folder) and the suite's again: nothing of the bundles collected
    mine = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--collect-only", "-q")
    assert mine.ret == pytest.ExitCode.NO_TESTS_COLLECTED, mine.stdout.str()
    again = pytester.runpytest_inprocess(*args[:-2], "--collect-only", "-q")
    collected = [line for line in again.stdout.lines if "::" in line]
    assert len(collected) == 2 and not [line for line in collected if "bundles" in line], collected


def test_a_pte_bundle_carries_plain_runtime_calls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], warm_torch: None
) -> None:
    """The snippet compares a mutated input, returned by the runtime as an extra output, with what eager
    left in it: replayed untouched it finds nothing, and it reports a stored eager value made wrong."""
    pytest.importorskip("executorch")
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from pytest_ptn.backends.pte import PteBackend

    case = Case(PteBackend(), BY_NAME["input_mutation"], lambda name: tmp_path / "lowered")
    (tmp_path / "lowered").mkdir()
    (tmp_path / "bundles").mkdir()
    case.lower()
    written = repro.write_bundle(tmp_path / "bundles", "pte", case, {})
    fresh = shutil.copytree(written, tmp_path / "elsewhere")
    shutil.rmtree(tmp_path / "lowered")
    snippet = fresh / pte_replay.SCRIPT
    assert "Runtime.get().load_program" in snippet.read_text()

    assert run_script(snippet) == 0, capsys.readouterr().out

    calls = fresh / repro.CALLS
    with safe_open(calls, "pt") as f:
        metadata = f.metadata()
    tensors = load_file(calls)
    tensors["0/inputs_after/0"] += 1
    save_file(tensors, calls, metadata=metadata)
    capsys.readouterr()
    assert run_script(snippet) == 1
    assert capsys.readouterr().out.startswith("call #0 step(): 0/inputs_after/0 is ")


def test_a_bf16_bundle_keeps_the_float64_run_its_bound_is_made_from(tmp_path: Path, warm_torch: None) -> None:
    """Read back, every output of a bf16 program gets the bound the suite compared it with, eager's own
    rounding (the float64 run) included: without it a replay would hold the backend to the eps terms only."""
    from pytest_ptn.backends.reference import ReferenceBackend
    from pytest_ptn.instruments.comparison import allowed

    case = Case(ReferenceBackend(), BY_NAME["kv_cache_in_bf16"], lambda name: tmp_path / "lowered")
    (tmp_path / "lowered").mkdir()
    case.lower()
    bundle = repro.write_bundle(tmp_path, "reference", case, {})
    read = repro.read_calls(bundle / repro.CALLS)
    noise = False
    for got, ran in zip(read, case.eager(), strict=True):
        assert got.wide is not None and ran.wide is not None
        for want, wide, ran_want, ran_wide in zip(
            got.outputs, got.output_bounds(), ran.outputs, ran.output_bounds(), strict=True
        ):
            assert torch.equal(allowed(want, wide), allowed(ran_want, ran_wide))
            noise |= bool((allowed(want, wide) > allowed(want)).any())
        assert got.wide.state_after.keys() == ran.wide.state_after.keys()
    assert noise  # the float64 run widens the bound somewhere: what this test is about


def test_a_bf16_pte_bundle_replays_with_the_suites_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], warm_torch: None
) -> None:
    """runtime_calls.py compares as the suite does: one bf16 step off eager is equal (a flat 1e-5 would flag
    it), the stored float64 run is part of the bound, a value far off is still a difference."""
    pytest.importorskip("executorch")
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from pytest_ptn.backend import WIDE_RUN
    from pytest_ptn.backends.pte import PteBackend
    from pytest_ptn.instruments.comparison import allowed

    case = Case(PteBackend(), BY_NAME["shared_weight_in_bf16"], lambda name: tmp_path / "lowered")
    (tmp_path / "lowered").mkdir()
    case.lower()
    snippet = repro.write_bundle(tmp_path, "pte", case, {}) / pte_replay.SCRIPT
    calls = snippet.parent / repro.CALLS
    with safe_open(calls, "pt") as f:
        metadata = f.metadata()
    stored = load_file(calls)
    key = "0/outputs/0"
    want = stored[key]
    assert want.dtype == torch.bfloat16 and f"{WIDE_RUN}/{key}" in stored

    def replayed(changed: dict[str, torch.Tensor]) -> object:
        save_file({**stored, **changed}, calls, metadata=metadata)
        capsys.readouterr()
        return run_script(snippet)

    assert replayed({}) == 0, capsys.readouterr().out
    assert replayed({key: torch.nextafter(want, torch.full_like(want, float("inf")))}) == 0
    wide = stored[f"{WIDE_RUN}/{key}"]
    beyond = 2 * allowed(want, wide) + 1  # past what the pte run may differ by
    far = (want.double() + beyond).to(want.dtype)  # eager and its float64 run both moved
    assert replayed({key: far, f"{WIDE_RUN}/{key}": wide + beyond}) == 1
    assert capsys.readouterr().out.startswith(f"call #0 {case.eager()[0].method}(): {key} is ")
    assert replayed({key: far, f"{WIDE_RUN}/{key}": far.double() + beyond}) == 0  # eager's noise, widened


def test_a_runtime_bundle_replays_through_the_runtime_with_executorch_on_the_bundled_pte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, warm_torch: None
) -> None:
    """A runtime of .pte files' bundle replays through that runtime, each difference saying what
    executorch.runtime gives on the bundled .pte, also where lowering again writes another .pte: here a
    later lowering that shares the state the bundled one copies per method (executorch.runtime on the new
    .pte would give eager's values, and blame the runtime for the lowering's copies)."""
    from pytest_ptn.backend import LOWERING_FAULT, resolve_backend
    from pytest_ptn.backends import pte_runtime
    from pytest_ptn.backends.pte import SharedStateBackend

    spec = "pte_runtimes:ExecutorchRuntime@portable"
    case = Case(resolve_backend(spec)(), BY_NAME["kv_cache"], lambda name: tmp_path / "lowered")
    (tmp_path / "lowered").mkdir()
    (tmp_path / "bundles").mkdir()
    case.lower()
    fresh = shutil.copytree(repro.write_bundle(tmp_path / "bundles", spec, case, {}), tmp_path / "elsewhere")
    shutil.rmtree(tmp_path / "lowered")
    monkeypatch.setitem(pte_runtime.LOWERINGS, "portable", SharedStateBackend)

    assert run_script(fresh / repro.REPRO_SCRIPT) == 1
    printed = capsys.readouterr().out.splitlines()
    assert (
        "note: lowering again wrote other bytes than the bundled artifact; replaying the bundled one"
        in printed
    )
    calls = [line for line in printed if line.strip().startswith("call #")]
    assert calls and all(
        line.endswith(f"executorch.runtime on the same .pte gives the same: {LOWERING_FAULT}")
        for line in calls
    ), printed
