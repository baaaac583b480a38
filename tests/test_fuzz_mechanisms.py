"""The fuzz sees past a backend's known bugs: failures by mechanism (pytest_ptn.mechanisms), listed per
mechanism in expectations, counted when listed, failing the test when not (spec v4)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_ptn import expectations
from pytest_ptn.backends.reference import ReferenceBackend
from pytest_ptn.cli.expectations_update import plan
from pytest_ptn.fuzzing.tally import FuzzTally, merged
from pytest_ptn.fuzzing.verdict import Verdict, unlisted
from pytest_ptn.mechanisms import (
    UNEXPLAINED,
    Kind,
    Mechanism,
    MechanismKeyError,
    Role,
    Step,
    check_key,
    crashed,
    raised,
)
from pytest_ptn.reporting import results
from pytest_ptn.spec import ProgramSpec


def test_a_key_says_kind_and_what_never_a_generated_name() -> None:
    a = raised(Step.LOWERING, ValueError("constant 'w' differs between methods 'prefill' and 'decoder'"), ())
    b = raised(Step.LOWERING, ValueError("constant 'kv' differs between methods 'm6' and 'step'"), ())
    assert a.key == b.key == "lowering:ValueError: constant '…' differs between methods '…' and '…'"
    running = raised(Step.RUNNING, RuntimeError("error 0x12\nmore"), ())
    assert running.key == "error:running:RuntimeError: error NxN"
    assert Mechanism(Kind.ZERO_FILLED, "state", "'m6_state'").key == "zero-filled:state"
    load = [RuntimeError(f"Failed to load method {m}, error: 0x20") for m in ("prefill", "m7")]
    assert {raised(Step.RUNNING, e, ["m7", "prefill", "step"]).key for e in load} == {
        "error:running:RuntimeError: Failed to load method …, error: NxN"
    }


def test_an_error_key_leaves_out_dtypes_and_shapes_too() -> None:
    """One message that varies by the program's dtypes or shapes is one key (spec v5): a loader binding
    another dtype's tensor is one bug, not one per pair of dtypes."""
    errors = [
        RuntimeError("Tensor dtype mismatch! Expected: Int, Got: Half"),
        RuntimeError("Tensor dtype mismatch! Expected: Float, Got: long int"),
        RuntimeError("Tensor dtype mismatch! Expected: BFloat16, Got: torch.float32"),
    ]
    keys = {raised(Step.RUNNING, e, ()).key for e in errors}
    assert keys == {"error:running:RuntimeError: Tensor dtype mismatch! Expected: <dtype>, Got: <dtype>"}
    shapes = [RuntimeError(f"expected shape {s} but got (4,)") for s in ("[2, 4]", "(16,)", "[1]")]
    assert len({raised(Step.RUNNING, e, ()).key for e in shapes}) == 1


def test_a_crash_key_comes_from_how_the_process_ended_never_from_its_words(tmp_path: Path) -> None:
    """Issue 58: a crash's key is made from values (signal, status, no report), never from a sentence: a
    signal with no name is ``signal`` whatever its number, no report is not guessed to be SIGKILL, and a
    crash replayed for a later test of its case keys as the first did, without that test's node id."""
    from pytest_ptn.instruments.process_end import ProcessEnd
    from pytest_ptn.scheduling import crashes

    unnamed = ProcessEnd.of(-42)
    assert str(unnamed).startswith("killed by signal 42")
    assert crashed(Step.RUNNING, unnamed).key == crashed(Step.RUNNING, ProcessEnd.of(-43)).key
    assert crashed(Step.RUNNING, unnamed).key == "crash:running:signal"
    assert crashed(Step.RUNNING, ProcessEnd.of(None)).key == "crash:running:no report"
    assert crashed(Step.LOWERING, ProcessEnd.of(7)).key == crashed(Step.LOWERING, ProcessEnd.of(1)).key
    with pytest.raises(MechanismKeyError, match="crash:<step>:<end>"):
        check_key("crash:running:status 7")

    (tmp_path / "gw0.last").write_text(
        json.dumps({"step": {"backend": "b", "scenario": "s", "step": "loading"}})
    )
    _, first = crashes.crash_report(tmp_path, "gw0", -42, "t.py::test_E1[b-s-up_front]", None, {})
    with pytest.raises(crashes.CrashedEarlier) as later:
        crashes.WorkerLog(tmp_path, "gw1").enter(crashes.Activity("b", "s", "loading"))
    assert later.value.mechanism.key == first.key == "crash:running:signal"
    assert "t.py" not in later.value.mechanism.key


@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("unexplained", "no mechanism"),
        ("zero-filled", "one of zero-filled:state"),
        ("zero-filled:weights", "one of zero-filled:state"),
        ("write-returned:anything", "one of write-returned:state"),
        ("lookalike:everything", "one of lookalike:state"),
        ("bogus:state", "unknown mechanism 'bogus:state'"),
        ("lowering", "names no step"),
        ("error:running:RuntimeError: error 0x12", "its key is error:running:RuntimeError: error NxN"),
        ("error:running:RuntimeError: Expected: Int", "a dtype"),
    ],
)
def test_a_key_no_expectation_can_list_is_refused(key: str, said: str) -> None:
    with pytest.raises(MechanismKeyError, match=said):
        check_key(key)


def test_each_unlisted_mechanism_fails_with_a_class_of_its_own() -> None:
    """Hypothesis keeps failures apart by their exception type: two mechanisms, two failures, each shrunk."""
    assert unlisted("zero-filled:constant") is unlisted("zero-filled:constant")
    assert unlisted("zero-filled:constant") is not unlisted("unexplained")
    verdict = Verdict((Mechanism(Kind.ZERO_FILLED, "state"), UNEXPLAINED), "")
    assert verdict.keys == ["unexplained", "zero-filled:state"]
    assert verdict.unlisted({"zero-filled:state"}) == ["unexplained"]


def _file(tmp_path: Path, entry: str, backend: str = "pte") -> Path:
    path = tmp_path / "known.toml"
    path.write_text(f'backend = "{backend}"\n[[xfail]]\nrule = "E1"\n{entry}reason = "r"\nlink = ""\n')
    return path


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ('scenario = "fuzz"\n', "a fuzz entry lists one mechanism"),
        ('scenario = "fuzz"\nmechanism = "unexplained"\n', "is no mechanism"),
        ('scenario = "fuzz"\nmechanism = "zero-filled:tensor"\n', "unknown mechanism"),
        ('scenario = "kv_cache"\nmechanism = "zero-filled:state"\n', "only the fuzz test's entries"),
    ],
)
def test_an_entry_that_would_hide_a_new_bug_is_refused(tmp_path: Path, entry: str, said: str) -> None:
    with pytest.raises(expectations.ExpectationsError, match=said):
        expectations.read(_file(tmp_path, entry))


def test_refusals_are_one_line_usage_errors(pytester: pytest.Pytester) -> None:
    """Exit 4 and one line: a whole-test fuzz entry, and a file for another backend than the run's."""
    whole = _file(pytester.path, 'scenario = "fuzz"\n')
    result = pytester.runpytest_subprocess(
        "--ptn-backend=reference", f"--ptn-expectations={whole}", "-k", "x"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --ptn-expectations: *a fuzz entry lists one mechanism*"])
    other = _file(pytester.path, 'scenario = "fuzz"\nmechanism = "zero-filled:state"\n', backend="pte")
    result = pytester.runpytest_subprocess(
        "--ptn-backend=reference", f"--ptn-expectations={other}", "-k", "x"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --ptn-expectations: *about backend 'pte', and this run tests reference*"]
    )


def _tally(seen: dict[str, int], listed: set[str], programs: int = 10) -> FuzzTally:
    tally = FuzzTally()
    for key, count in seen.items():
        for i in range(count):
            tally.add([key], listed, f"program {key} {i}", (2 + i, 3, 1))
    for _ in range(programs - sum(seen.values())):
        tally.add([], listed, "clean", (1, 1, 1))
    return tally.finish(listed)


def test_the_tally_merges_shares_unlisted_first_and_names_the_unseen() -> None:
    listed = {"zero-filled:state", "shared-arena:state"}
    a = _tally({"zero-filled:state": 3, "unexplained": 1}, listed)
    b = _tally({"zero-filled:state": 1}, listed)
    both = merged([a, b])
    assert both.programs == 20 and both.clean == 15
    assert [key for key, _ in both.ordered()] == ["unexplained", "zero-filled:state"]
    assert both.mechanisms["zero-filled:state"].programs == 4
    assert both.mechanisms["zero-filled:state"].size == (2, 3, 1)  # the smallest of either share
    assert both.unseen == ("shared-arena:state",)
    line = both.line("pte")
    assert line.startswith("fuzz on pte: 20 programs, 15 clean; UNLISTED unexplained x1")
    assert "listed, unseen: shared-arena:state" in line
    again = FuzzTally.from_data(json.loads(both.to_json()))
    assert again == both


def _fuzz_row(tally: FuzzTally, outcome: str = results.PASS) -> results.Result:
    return results.Result("E1", "MUST", "fuzz", "pte", outcome, "", "", None, "t::fuzz[pte]", fuzz=tally)


def test_results_json_keeps_the_tally() -> None:
    doc = results.Results("4", {}, [_fuzz_row(_tally({"zero-filled:state": 2}, {"zero-filled:state"}))])
    assert results.from_dict(json.loads(json.dumps(results.to_dict(doc)))) == doc


def test_update_lists_what_programs_showed_drops_the_unseen_and_never_lists_unexplained(
    tmp_path: Path,
) -> None:
    path = _file(tmp_path, 'scenario = "fuzz"\nmechanism = "shared-arena:state"\n')
    entries = expectations.read(path).entries
    tally = _tally({"zero-filled:state": 2, "unexplained": 1}, {"shared-arena:state"})
    update, final = plan(path, "pte", entries, [_fuzz_row(tally, results.FAIL)])
    assert [e.mechanism for e in update.stale] == ["shared-arena:state"]
    assert [e.mechanism for e, _ in final] == ["zero-filled:state"]
    assert any("no mechanism explains" in note for note in update.notes)


# --- broken variants of pte, judged with pte's own shipped expectations ------------------------------------


@pytest.mark.parametrize(
    ("variant", "said"),
    [
        ("DoublesNumberedMethods", "mechanism unexplained is not listed"),
        ("ZeroesCollidingConstants", "is not listed"),
    ],
)
def test_the_fuzz_finds_a_new_bug_behind_pte_s_known_ones(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, variant: str, said: str
) -> None:
    """pte's expectations list its mechanisms (zero-filled state, the shared arena); a variant with a bug
    only generated programs show, and one whose values are a neighbour of a listed mechanism (a constant,
    not state, starting zero-filled), each fails the fuzz test naming what is unlisted."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    result = pytester.runpytest_subprocess(
        f"--ptn-backend=broken_pte:{variant}", "-k", "fuzz", "-p", "no:cacheprovider", "--ptn-report", "out"
    )
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert said in out and "fuzz on broken_pte:" in out
    if variant == "ZeroesCollidingConstants":
        assert "UNLISTED zero-filled:" in out


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # to_native reads its schema with read_text
def test_a_buffer_the_package_binds_to_a_tensor_lowering_minted_is_by_name(tmp_path: Path) -> None:
    """native's package holds the scalar forward() lifts as '_lifted_tensor_constant0', the name of decoder's
    own non-persistent buffer, and binds decoder's buffer to it: no replay can bind a float scalar where the
    graph wants int32, so the package itself is the evidence (``check.package.bound_elsewhere``, in the
    fuzz and check_program alike)."""
    pytest.importorskip("executorch")
    from pytest_ptn.backends.native.backend import NativeBackend
    from pytest_ptn.fuzzing.verdict import verdict_on
    from pytest_ptn.spec import Constant, Method, ProgramSpec

    lifted = Constant(
        "_lifted_tensor_constant0", "buffer", dtype="int32", shape=(4,), seed=3, persistent=False
    )
    spec = ProgramSpec(
        methods=(
            Method(
                "forward", (Constant("bias", "scalar", shape=(), seed=3, values=(0.125,)),), reads=("bias",)
            ),
            Method("decoder", (lifted,), reads=("_lifted_tensor_constant0",)),
        ),
        calls=("forward", "decoder"),
    )
    verdict = verdict_on(NativeBackend(), spec, tmp_path)
    assert verdict.keys == ["by-name:buffer"], verdict.message
    said = "binds '_lifted_tensor_constant0' of decoder() to '_lifted_tensor_constant0', a float32 tensor of "
    assert said + "shape () also bound by forward()" in verdict.message, verdict.message

    # check_program reads the same package (check.package.bound_elsewhere): one judge (issue 58)
    from pytest_ptn.check import check_program
    from pytest_ptn.programs.build import Program

    program = Program(spec)
    inputs = {m: program.example_inputs(m) for m in program.method_names}
    found = check_program(program.modules(), inputs, backend=NativeBackend(), workdir=tmp_path / "check")
    keys = {m.key for f in found if f.rule == "E1" and f.call is not None for m in f.mechanisms}
    assert "by-name:buffer" in keys, [str(f) for f in found]
    # the package explains decoder's value: an isolation defect, not the method's accuracy, whatever the
    # method alone gives (check.wrong_values: one evidence for E1 and A1)
    assert not [f for f in found if f.rule == "A1"], [str(f) for f in found]


def _two_dtypes_one_name() -> ProgramSpec:
    """Two methods holding ``w`` of two dtypes: a loader that binds by name hands one method the other's
    tensor, and the method's graph refuses it (a dtype check) rather than giving a wrong value."""
    from pytest_ptn.spec import Constant, Method, ProgramSpec

    return ProgramSpec(
        methods=(
            Method("prefill", (Constant("w", "attribute", dtype="int32", seed=1),), reads=("w",)),
            Method("decode", (Constant("w", "attribute", dtype="float16", seed=2),), reads=("w",)),
        ),
        calls=("prefill", "decode"),
    )


def test_an_error_a_by_name_binding_reproduces_is_by_name_not_its_message(
    tmp_path: Path, warm_torch: None
) -> None:
    """One bug, one mechanism (spec v5): the by-name loader's dtype mismatch is by-name, as its wrong values
    are, because binding the other method's ``w`` makes the program raise the same; so says check_program."""
    from broken_backends import BindsByKey

    from pytest_ptn.check import check_program
    from pytest_ptn.fuzzing.verdict import verdict_on
    from pytest_ptn.programs.build import Program

    (tmp_path / "fuzz").mkdir()
    (tmp_path / "clean").mkdir()
    verdict = verdict_on(BindsByKey(), _two_dtypes_one_name(), tmp_path / "fuzz")
    assert verdict.keys == ["by-name:constant"], verdict.message
    assert "Tensor dtype mismatch" in verdict.message and "'w' raises" in verdict.message
    assert verdict_on(ReferenceBackend(), _two_dtypes_one_name(), tmp_path / "clean").keys == []

    program = Program(_two_dtypes_one_name())
    inputs = {m: program.example_inputs(m) for m in program.method_names}
    found = check_program(program.modules(), inputs, backend=BindsByKey())
    raised_findings = [f for f in found if f.stage == "run"]
    assert raised_findings and all(m.key == "by-name:constant" for f in raised_findings for m in f.mechanisms)


def test_an_error_no_binding_reproduces_keeps_its_message_key(tmp_path: Path, warm_torch: None) -> None:
    """A backend that raises for its own reasons is not blamed on a binding: the key is its message."""
    from pytest_ptn.fuzzing.verdict import verdict_on

    class Refuses(ReferenceBackend):  # refuses every call
        name = "refuses"

        def load(self, lowered):  # type: ignore[no-untyped-def]
            loaded = super().load(lowered)

            def run(method, inputs):  # type: ignore[no-untyped-def]
                raise RuntimeError(f"kernel for {method} missing: code 0x{len(inputs):x}")

            loaded.run = run
            return loaded

    verdict = verdict_on(Refuses(), _two_dtypes_one_name(), tmp_path)
    assert verdict.keys == ["error:running:RuntimeError: kernel for … missing: code NxN"]


def test_each_wrong_value_may_be_another_fault_s(tmp_path: Path, warm_torch: None) -> None:
    """A loader that zero-fills every integer constant: one call reads two of them, and no single binding
    gives both values; each wrong value is one replay's (a zero-filled constant and a zero-filled buffer),
    so the call is explained, not ``unexplained`` (the nightly's 17 programs of 50 before)."""
    from defect_corpus import IntegerConstantsZeroFilled, two_integers_read_together

    from pytest_ptn.fuzzing.verdict import verdict_on

    verdict = verdict_on(IntegerConstantsZeroFilled(), two_integers_read_together(), tmp_path)
    assert verdict.keys == ["zero-filled:buffer", "zero-filled:constant"], verdict.message


def test_a_metadata_only_cache_is_lookalike_or_by_name_never_unexplained(
    tmp_path: Path, warm_torch: None
) -> None:
    """A cache keyed by dtype, shape and strides (PR #21959's check) hands a method the first tensor of its
    metadata, whatever its name: under another name that is ``lookalike`` (a check of less than the
    content), under the same name ``by-name``."""
    from broken_backends import MetadataOnly

    from pytest_ptn.fuzzing.verdict import verdict_on
    from pytest_ptn.spec import Constant, Method

    spec = ProgramSpec(
        methods=(
            Method("prefill", (Constant("a", "parameter", seed=1),), reads=("a",)),
            Method("decode", (Constant("b", "parameter", seed=2),), reads=("b",)),
        ),
        calls=("prefill", "decode"),
    )
    verdict = verdict_on(MetadataOnly(), spec, tmp_path)
    assert verdict.keys == ["lookalike:constant"], verdict.message


def test_state_put_back_by_a_late_load_is_reinitialised_not_a_private_copy(
    tmp_path: Path, warm_torch: None
) -> None:
    """State a method's late load puts back to its initial value (executorch#21958) reads like a private
    copy on the loading method's first call; loading every method up front gives the right value, and the
    method that wrote before reads its own write no more, so the replay of that load schedule names it:
    one mechanism, ``reinitialised:state``. A private copy stays one."""
    from broken_backends import ReinitOnLateLoad, StateCopiedPerMethod

    from pytest_ptn.harness import Case
    from pytest_ptn.programs.catalogue import BY_NAME
    from pytest_ptn.schedule import LoadSchedule

    def keys(backend: ReferenceBackend, schedule: LoadSchedule) -> set[str]:
        workdir = tmp_path / f"{backend.name}-{schedule.value}"
        workdir.mkdir()
        case = Case(backend, BY_NAME["kv_cache_in_fp16"], lambda name: workdir)
        found = case.run_sequence(case.load(), schedule=schedule)
        return {m.key for mismatch in found for m in mismatch.mechanisms}

    assert keys(ReinitOnLateLoad(), LoadSchedule.AT_FIRST_CALL) == {"reinitialised:state"}
    assert keys(ReinitOnLateLoad(), LoadSchedule.UP_FRONT) == set()
    assert keys(StateCopiedPerMethod(), LoadSchedule.AT_FIRST_CALL) == {"private-copy:state"}
    assert keys(StateCopiedPerMethod(), LoadSchedule.UP_FRONT) == {"private-copy:state"}


def test_a_cache_that_outlives_its_program_is_by_name_in_the_fuzz(
    tmp_path: Path, warm_torch: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process-wide cache keyed by name (the CUDA delegate's, executorch#21823) hands each later program the
    first one's tensors: a wrong value where the dtypes agree, an error where they do not. The fuzz keeps
    what the programs it judged held (check.earlier), and a replay bound to those names both ``by-name``;
    without that record, nothing the program alone can be bound to gives either."""
    import broken_backends

    from pytest_ptn.check.earlier import EarlierPrograms
    from pytest_ptn.fuzzing.verdict import verdict_on
    from pytest_ptn.spec import Constant, Method

    monkeypatch.setattr(broken_backends, "PROCESS_WIDE", {})

    def program(dtype: str, seed: int) -> ProgramSpec:
        w = Constant("w", "attribute", dtype=dtype, seed=seed)
        return ProgramSpec(methods=(Method("prefill", (w,), reads=("w",)),), calls=("prefill",))

    backend, earlier = broken_backends.ProcessWideByName(), EarlierPrograms()
    verdicts = []
    for i, (dtype, seed) in enumerate([("float32", 1), ("float32", 2), ("int32", 3)]):
        (tmp_path / str(i)).mkdir()
        verdicts.append(verdict_on(backend, program(dtype, seed), tmp_path / str(i), earlier=earlier))
    assert [v.keys for v in verdicts] == [[], ["by-name:constant"], ["by-name:constant"]], [
        v.message for v in verdicts
    ]
    assert "the first tensors this process loaded under the same method and name" in verdicts[1].message
    (tmp_path / "alone").mkdir()
    assert verdict_on(backend, program("float32", 4), tmp_path / "alone").keys != ["by-name:constant"]


def test_a_tie_one_program_cannot_break_goes_to_the_kind_earlier_programs_showed() -> None:
    """Two bindings of different kinds may give one program's wrong value, or raise its error, alike (a
    dedupe that ignores dtype binds a float tensor where another method's same-named float tensor would
    raise the same "Tensor dtype mismatch"). One bug shows as one kind in every program: the kind the
    process's earlier programs showed most takes the tie; with nothing shown, the replays' own order."""
    import torch

    from pytest_ptn.check.explain import Replay, explaining_error, explanations

    error = RuntimeError("Tensor dtype mismatch! Expected: Int, Got: float")
    by_name = Mechanism(Kind.BY_NAME, Role.BUFFER, "method 'm6' read method 'prefill''s '_scale_1'")
    alike = Mechanism(Kind.LOOKALIKE, Role.BUFFER, "method 'm6' read 'prefill''s 'bias' for its '_scale_1'")
    raising = [Replay("by name", [], (by_name,), error, 0), Replay("alike", [], (alike,), error, 0)]
    assert explaining_error(raising, error, 0) is raising[0]
    assert explaining_error(raising, error, 0, shown={Kind.LOOKALIKE: 3, Kind.BY_NAME: 1}) is raising[1]

    wrong = [[torch.tensor([2.0])]]
    giving = [Replay("by name", wrong, (by_name,)), Replay("alike", wrong, (alike,))]
    found = explanations(giving, wrong, {0: "m6"})
    assert found[0][0] is giving[0]
    found = explanations(giving, wrong, {0: "m6"}, shown={Kind.LOOKALIKE: 2})
    assert found[0][0] is giving[1]


class NamesAMethodWhenLowering(ReferenceBackend):
    """A lowering that refuses a program naming its first method bare, as executorch's messages do."""

    name = "names-a-method"

    def lower(self, programs: dict[str, torch.export.ExportedProgram], workdir: Path) -> Any:
        raise ValueError(f"cannot lower method {next(iter(programs))}: constant table full")


def test_one_error_is_one_key_in_the_scenario_tests_and_the_fuzz(tmp_path: Path, warm_torch: None) -> None:
    """The program's method names are left out of an error's key wherever it is made: a scenario test's
    lowering (harness.Case) keys the error as the fuzz does (mechanisms.raised with the program's names),
    whatever the methods are called."""
    from pytest_ptn.harness import Case
    from pytest_ptn.programs.catalogue import BY_NAME

    keys = set()
    for scenario in ("kv_cache", "colliding_tensor_constants"):
        case = Case(NamesAMethodWhenLowering(), BY_NAME[scenario], lambda name: tmp_path)
        with pytest.raises(pytest.fail.Exception):
            case.lower()
        keys |= {m.key for m in case.found}
    fuzz = raised(Step.LOWERING, ValueError("cannot lower method m6: constant table full"), ["m6", "step"])
    assert keys == {fuzz.key}
    assert "m6" not in fuzz.key
