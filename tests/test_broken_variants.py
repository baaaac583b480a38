"""Every conformance rule catches the broken reference variant made for it (tests/broken_backends.py)."""

from __future__ import annotations

import pytest
from broken_backends import BROKEN

from pytest_ptn.plugin import suite_path
from pytest_ptn.ruleset import RULES, WAITS_FOR_CLOCK


def test_every_rule_with_tests_has_a_broken_variant() -> None:
    assert set(BROKEN) == set(RULES)


@pytest.mark.parametrize("rule", sorted(BROKEN))
def test_suite_catches_broken_variant(rule: str, pytester: pytest.Pytester, warm_torch: None) -> None:
    variant = BROKEN[rule]
    # --maxfail does not stop at an expected (SHOULD) failure, so a SHOULD rule's variant runs few scenarios:
    # single_method for a rule whose every test waits for the zip clock (seconds each); for A1, whose test
    # runs on every valid scenario and sees the variant's 6% error in each, the float32 KV cache alone; the
    # float32 ones for the other SHOULD rules (the reduced-precision scenarios' verdicts are
    # test_comparison.py's).
    if rule in WAITS_FOR_CLOCK:
        scope = ["-k", "single_method"]
    elif rule == "A1":
        scope = ["-k", "kv_cache and not in_bf16 and not in_fp16"]
    elif RULES[rule].level == "SHOULD":
        scope = ["-k", "not in_bf16 and not in_fp16"]
    else:
        scope = []
    result = pytester.runpytest_inprocess(
        str(suite_path()),
        f"--ptn-backend=broken_backends:{variant.__name__}",
        "-m",
        rule,
        *scope,
        "-p",
        "no:cacheprovider",
        "--maxfail=1",
        "-rx",
    )
    outcomes = result.parseoutcomes()
    if RULES[rule].level == "SHOULD":
        assert outcomes.get("xfailed", 0) > 0 and result.ret == 0, outcomes
        result.stdout.fnmatch_lines([f"*SHOULD rule {rule} not met*"])
    else:
        assert outcomes.get("failed", 0) > 0, (
            f"{variant.__name__} breaks {rule} but the suite passed: {outcomes}"
        )


def test_a_cache_as_long_lived_as_its_backend_fails_s4_never_a_later_case(
    pytester: pytest.Pytester, warm_torch: None
) -> None:
    """Each test loads through a backend instance of its own (Case.loader): a by-name cache held by the
    backend object (upstream's CUDA delegate holds one per process) is caught by S4, its two programs loaded
    through one instance, while every other case's verdict is its own, whatever ran before it."""
    result = pytester.runpytest_inprocess(
        str(suite_path()),
        "--ptn-backend=broken_backends:InstanceWideByName",
        "-m",
        "E1 or S4",
        "-k",
        "not in_bf16 and not in_fp16 and not fuzz",
        "-p",
        "no:cacheprovider",
    )
    failed = [line for line in result.outlines if line.startswith("FAILED")]
    assert failed and all("test_two_programs_in_one_process_do_not_leak" in line for line in failed), failed


def test_a_loader_that_skips_the_input_check_fails_x1(pytester: pytest.Pytester, warm_torch: None) -> None:
    """X1's second variant (BROKEN holds one a rule): calls with inputs the method does not take run."""
    result = pytester.runpytest_inprocess(
        str(suite_path()),
        "--ptn-backend=broken_backends:UncheckedInputs",
        "-k",
        "test_call_with_wrong_inputs_is_refused and not in_bf16 and not in_fp16",
        "-p",
        "no:cacheprovider",
    )
    failed = [line for line in result.outlines if line.startswith("FAILED")]
    assert failed and all("test_call_with_wrong_inputs_is_refused" in line for line in failed), failed
    result.stdout.fnmatch_lines(["*accepted, returned outputs*"])


def _fails_only(pytester: pytest.Pytester, variant: str, test: str, says: str) -> None:
    """The suite on broken variant ``variant`` (tests/broken_backends.py), ``test`` selected: it fails, saying
    ``says`` (a glob), and no other test does."""
    result = pytester.runpytest_inprocess(
        str(suite_path()),
        f"--ptn-backend=broken_backends:{variant}",
        "-k",
        f"{test} and not in_bf16 and not in_fp16",
        "-p",
        "no:cacheprovider",
    )
    failed = [line for line in result.outlines if line.startswith("FAILED")]
    assert failed and all(test in line for line in failed), failed
    result.stdout.fnmatch_lines([says])


def test_a_reader_that_refuses_every_zip_flag_fails_x2(pytester: pytest.Pytester, warm_torch: None) -> None:
    """X2's other side: a package rezipped with data descriptors or its names flagged as UTF-8 is no damage,
    and the reader that takes any flag bit for one refuses it."""
    test = "test_package_rewritten_by_another_zip_writer_reads_the_same"
    _fails_only(pytester, "RefusesZipFlags", test, "*sets flag bits*refused as unsupported*")


def test_a_reader_that_drops_a_chunk_tail_fails_p4(pytester: pytest.Pytester, warm_torch: None) -> None:
    """P4 past the catalogue's sizes: a tensor of 2.5 MiB, read a whole 1 MiB chunk at a time, loses its
    tail; none of the catalogue's tensors has one (each is under a chunk, or whole chunks)."""
    _fails_only(pytester, "DropsChunkTails", "test_a_deep_model_is_stored_once", "*does not hold method*")


def test_a_loader_held_to_traced_shapes_fails_e1(pytester: pytest.Pytester, warm_torch: None) -> None:
    """E1 over a dynamic dimension: a loader that takes each input only at its traced shape refuses calls
    at the range's other sizes."""
    test = "test_calls_across_a_dynamic_range_match_eager"
    _fails_only(pytester, "TracedShapesOnly", test, "*takes input 0 as shape (5, 320), not (2, 320)*")
