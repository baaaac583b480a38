"""The pytest plugin as a backend author meets it: options, header, errors, collection, ids, expectations.

Every run selects one to three scenarios with ``-m``/``-k`` so that it lowers little; runs whose outcome
travels from xdist workers to the controller (collection, SHOULD outcomes, known-failure markers) are made
both without xdist and with ``-n 2``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_ptn.plugin import suite_path
from pytest_ptn.programs.catalogue import tagged
from pytest_ptn.ruleset import SPEC_VERSION

TESTS = Path(__file__).resolve().parent
SUITE = suite_path()
REJECTS = sorted(s.name for s in tagged("reject"))
X1_NAMES = [f"test_rejection_names_method_and_key[reference-{name}]" for name in REJECTS]
X1_REJECTIONS = ("-m", "X1", "-k", "test_rejection_names_method_and_key")
"""X1's tests of rejected programs (one a `reject` scenario); not X1's call with wrong inputs."""
QUIET = ("-p", "no:cacheprovider")


@pytest.fixture(scope="module", autouse=True)
def warm() -> None:
    """Lower and load one program in this process before any in-process run.

    ``runpytest_inprocess`` drops every module a run imported; torch imports much of its export machinery
    lazily on the first export, and a half-dropped torch breaks later exports. Importing it here keeps it.
    Hypothesis too: its pytest plugin imports it in every run, and each fresh import is assertion-rewritten
    anew (pytest rewrites every package of a plugin's distribution), which costs seconds per run.
    """
    import hypothesis  # noqa: F401

    from pytest_ptn.backends.reference import ReferenceBackend
    from pytest_ptn.harness import Case
    from pytest_ptn.programs.catalogue import BY_NAME

    with tempfile.TemporaryDirectory() as tmp:
        case = Case(ReferenceBackend(), BY_NAME["single_method"], lambda name: Path(tmp))
        case.run_sequence(case.load())
        case.exported()


@pytest.fixture(params=[["-n", "0"], ["-n", "2"]], ids=["serial", "xdist"])
def mode(request: pytest.FixtureRequest) -> list[str]:
    return request.param


@pytest.fixture
def broken(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """``broken_backends`` importable in this process and in xdist workers.

    xdist sets a local worker's ``sys.path`` to the controller's sys.path *as it was at interpreter start*
    (xdist.plugin._sys_path), so neither syspath_prepend nor PYTHONPATH reaches the workers; the
    ``pythonpath`` ini option does, since every worker reads the ini file before the plugin resolves its
    backends.
    """
    monkeypatch.syspath_prepend(str(TESTS))
    pytester.makeini(f"[pytest]\npythonpath = {TESTS}\n")
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_inprocess(*QUIET, *args)


def glob(text: str) -> str:
    """``text`` as an fnmatch pattern that matches only itself (test ids hold brackets)."""
    return re.sub(r"([\[\]*?])", r"[\1]", text)


def junit_cases(path: Path) -> dict[str, list[tuple[str, str]]]:
    """testcase name -> its (name, value) properties."""
    return {
        case.get("name", ""): [(p.get("name", ""), p.get("value", "")) for p in case.iter("property")]
        for case in ET.parse(path).getroot().iter("testcase")
    }


# --- options, header, errors ---------------------------------------------------------------------------


def test_help_lists_the_ptn_options(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--help")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            "pytest-ptn: ExecuTorch backend conformance:",
            "*--ptn-backend=NAME*",
            "*--ptn-expectations=PATH*",
            "*--ptn-no-expectations*",
            "*--ptn-report=DIR*",
        ]
    )
    result.stdout.fnmatch_lines(
        ["  ptn_backends (linelist):*", "*backends to run when --ptn-backend is not given"]
    )


@pytest.mark.parametrize("args", [["--help"], ["--co"]], ids=["help", "collect-only"])
def test_loading_the_plugin_imports_neither_torch_nor_executorch(
    pytester: pytest.Pytester, args: list[str]
) -> None:
    pytester.makepyfile(test_plain="def test_nothing():\n    pass\n")
    result = pytester.run(sys.executable, "-X", "importtime", "-m", "pytest", *QUIET, *args)
    assert result.ret == pytest.ExitCode.OK
    imported = [
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.lines if line.startswith("import time:")
    ]
    assert "pytest_ptn.expectations" in imported, "the plugin was not loaded at all"
    heavy = [m for m in imported if m.split(".")[0] in ("torch", "executorch")]
    assert not heavy, f"loading the plugin imported {heavy[:5]}"


def test_header_names_the_requested_backend_with_versions(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--ptn-backend=reference", "--co", "-m", "P6")
    result.stdout.fnmatch_lines(
        [
            f"ptn: conformance spec v{SPEC_VERSION}*",
            "ptn backend reference: available (torch *, safetensors *)",
        ]
    )


def test_unknown_backend_is_a_usage_error_listing_installed_ones(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--ptn-backend=no-such-backend")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown backend 'no-such-backend' (installed: *reference*)*"])


def test_unimportable_module_class_backend_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--ptn-backend=no_such_module_anywhere:Backend")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cannot import backend 'no_such_module_anywhere:Backend'*"])


def test_unavailable_backend_fails_the_run_with_its_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        ptn_unavailable_backend="""
        from pytest_ptn.backend import Availability
        from pytest_ptn.backends.reference import ReferenceBackend

        class NeedsSDK(ReferenceBackend):
            name = "needs-sdk"

            @classmethod
            def availability(cls):
                return Availability(False, "the frobnicator SDK is not installed")
        """
    )
    pytester.syspathinsert()
    result = run(pytester, "--ptn-backend=ptn_unavailable_backend:NeedsSDK", "-m", "P6")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*--ptn-backend=ptn_unavailable_backend:NeedsSDK is unavailable*: "
            "the frobnicator SDK is not installed*"
        ]
    )
    result.stdout.no_fnmatch_line("*skipped*")
    result.stdout.no_fnmatch_line("*passed*")


def test_a_runtime_that_cannot_load_is_unavailable_before_any_test(pytester: pytest.Pytester) -> None:
    """In-process here (the xdist worker's way: tests/test_pte_backend.py); a run that only collects asks
    nothing of the runtime."""
    pytester.makepyfile(
        ptn_no_runtime_backend="""
        from pytest_ptn.backends.reference import ReferenceBackend

        class BuiltForAnotherTorch(ReferenceBackend):
            name = "another-torch"

            @classmethod
            def load_runtime(cls):
                raise ImportError("libvendor.so: undefined symbol: _ZN3c104impl3cow11cow_deleterEPv")
        """
    )
    pytester.syspathinsert()
    args = ("--ptn-backend=ptn_no_runtime_backend:BuiltForAnotherTorch", "-m", "P1")
    result = run(pytester, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*--ptn-backend=ptn_no_runtime_backend:BuiltForAnotherTorch is unavailable on this machine: its "
            "runtime cannot be loaded: ImportError: libvendor.so: undefined symbol: *"
        ]
    )
    result.stdout.no_fnmatch_line("*passed*")
    assert run(pytester, *args, "--co").ret == pytest.ExitCode.OK


# --- collection ------------------------------------------------------------------------------------------


def test_empty_folder_runs_the_installed_suite(pytester: pytest.Pytester, mode: list[str]) -> None:
    """The empty-folder run: same ids with and without xdist; user_properties reach the JUnit XML."""
    assert not list(pytester.path.iterdir())
    result = run(pytester, "--ptn-backend=reference", *X1_REJECTIONS, "--junitxml=junit.xml", "-rp", *mode)
    assert result.ret == pytest.ExitCode.OK
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == len(REJECTS) and "failed" not in outcomes, outcomes
    result.stdout.fnmatch_lines(["ptn backend reference: available (torch *"])
    passed = [
        line.split("::", 1)[1]
        for line in result.stdout.lines
        if line.startswith("PASSED test_rejection.py::")
    ]
    assert sorted(passed) == X1_NAMES
    cases = junit_cases(pytester.path / "junit.xml")
    assert sorted(cases) == X1_NAMES
    for name, properties in cases.items():
        scenario = name.split("-", 1)[1].rstrip("]")
        assert ("ptn_rule", "X1") in properties
        assert ("ptn_backend", "reference") in properties
        assert ("ptn_scenario", scenario) in properties
        repro = dict(properties)["ptn_repro"]
        assert repro.startswith("pytest ") and repro.endswith(" --ptn-backend=reference")
        module = "pytest_ptn.conformance.test_rejection"
        assert repro == f"pytest --pyargs '{module}::{name}' --ptn-backend=reference"  # runs from any folder


def test_without_a_backend_an_empty_folder_collects_nothing(pytester: pytest.Pytester) -> None:
    result = run(pytester)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(["collected 0 items"])
    result.stdout.no_fnmatch_line("ptn*")  # no header either: the plugin stays out of runs that do not use it


def test_backend_with_user_tests_in_the_folder_adds_the_suite(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine="def test_mine():\n    pass\n")
    result = run(
        pytester, "--ptn-backend=reference", "--co", "-q", "-k", "test_mine or named_state_is_rejected"
    )
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["test_mine.py::test_mine", "*test_method_named_state_is_rejected*"])


@pytest.mark.parametrize("target", ["suite", "file"])
def test_explicit_path_does_not_add_the_suite_twice(pytester: pytest.Pytester, target: str) -> None:
    assert SUITE is not None
    path = SUITE if target == "suite" else SUITE / "test_rejection.py"
    result = run(pytester, "--ptn-backend=reference", "--co", "-q", "-m", "P6", str(path))
    assert result.ret == pytest.ExitCode.OK
    ids = [line for line in result.stdout.lines if "::" in line]
    assert len(ids) == 1 and ids[0].endswith(
        "test_method_named_state_is_rejected[reference-method_named_state]"
    )


def test_explicit_other_path_does_not_collect_the_suite(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine="def test_mine():\n    pass\n")
    result = run(pytester, "--ptn-backend=reference", "--co", "-q", "test_mine.py")
    assert result.ret == pytest.ExitCode.OK
    assert [line for line in result.stdout.lines if "::" in line] == ["test_mine.py::test_mine"]


def test_rule_markers_are_registered(pytester: pytest.Pytester) -> None:
    from pytest_ptn.ruleset import RULES

    result = run(pytester, "--markers")
    result.stdout.fnmatch_lines(
        [f"@pytest.mark.{r.id}: conformance rule {r.id} ({r.level}): *" for r in RULES.values()]
    )
    result.stdout.fnmatch_lines(["@pytest.mark.ptn_scenarios(tag): *"])


def test_rule_marker_selects_only_that_rule_and_ids_name_backend_and_scenario(
    pytester: pytest.Pytester,
) -> None:
    result = run(pytester, "--ptn-backend=reference", "--co", "-q", "-m", "P6")
    assert result.ret == pytest.ExitCode.OK
    ids = [line for line in result.stdout.lines if "::" in line]
    assert len(ids) == 1, ids
    assert ids[0].endswith(
        "test_rejection.py::test_method_named_state_is_rejected[reference-method_named_state]"
    )


def test_ini_ptn_backends_works_like_the_option(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nptn_backends =\n    reference\n")
    result = run(pytester, "--co", "-q", "-m", "P6")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        ["*" + glob("test_method_named_state_is_rejected[reference-method_named_state]")]
    )
    header = run(pytester, "--co", "-m", "P6")
    header.stdout.fnmatch_lines(["ptn backend reference: available (torch *"])


# --- SHOULD rules -------------------------------------------------------------------------------------


def test_should_rule_failure_is_xfailed_and_shown_in_the_matrix(
    broken: pytest.Pytester, mode: list[str]
) -> None:
    result = run(
        broken, "--ptn-backend=broken_backends:Nondeterministic", "-m", "P9", "-k", "single_method", *mode
    )
    assert result.ret == pytest.ExitCode.OK
    outcomes = result.parseoutcomes()
    assert outcomes.get("xfailed") == 1 and "failed" not in outcomes, outcomes
    result.stdout.fnmatch_lines(
        [
            f"*= ptn conformance (spec v{SPEC_VERSION}) =*",
            "*broken_backends:Nondeterministic*",
            "SHOULD rules",
            "  P9 *deterministic *1F",
            "legend: *",
        ]
    )


# --- expectations ---------------------------------------------------------------------------------------

LINK = "https://example.org/bug/1"


def expectations_file(pytester: pytest.Pytester, backend: str, entry: str) -> Path:
    return pytester.makefile(".toml", **{f"{backend}-known": f'backend = "{backend}"\n\n[[xfail]]\n{entry}'})


X1_ANY = f'rule = "X1"\nscenario = "*"\nreason = "messages are vague"\nlink = "{LINK}"\n'


def test_expectations_turn_known_failures_into_xfails(broken: pytest.Pytester) -> None:
    path = expectations_file(broken, "broken-x1", X1_ANY)
    result = run(
        broken, "--ptn-backend=broken_backends:VagueErrors", *X1_REJECTIONS, f"--ptn-expectations={path}"
    )
    assert result.ret == pytest.ExitCode.OK
    outcomes = result.parseoutcomes()
    assert outcomes.get("xfailed") == len(REJECTS) and "failed" not in outcomes, outcomes
    result.stdout.fnmatch_lines([f"ptn expectations for broken-x1: {path} (1 known failures)"])
    result.stdout.fnmatch_lines(["  X1 *clear rejection *3x"])


def test_no_expectations_makes_known_failures_fail(broken: pytest.Pytester) -> None:
    path = expectations_file(broken, "broken-x1", X1_ANY)
    result = run(
        broken,
        "--ptn-backend=broken_backends:VagueErrors",
        *X1_REJECTIONS,
        f"--ptn-expectations={path}",
        "--ptn-no-expectations",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert result.parseoutcomes().get("failed") == len(REJECTS)
    result.stdout.fnmatch_lines(["*ValueError: 'invalid program' does not name*"])


def test_expectation_that_passes_is_stale_and_fails_the_run(pytester: pytest.Pytester) -> None:
    path = expectations_file(pytester, "reference", X1_ANY)
    result = run(
        pytester,
        "--ptn-backend=reference",
        "-m",
        "X1",
        "-k",
        "method_named_state",
        f"--ptn-expectations={path}",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert result.parseoutcomes().get("failed") == 1
    result.stdout.fnmatch_lines(["*XPASS(strict)*known failure of reference on X1*stale*"])


def test_expectations_for_another_backend_are_refused_in_one_line(pytester: pytest.Pytester) -> None:
    """A file given for a backend the run does not test would apply to nothing: the run then failed or
    passed with no hint why; it is a usage error naming both."""
    path = expectations_file(pytester, "broken-x1", X1_ANY)
    result = run(pytester, "--ptn-backend=reference", "-m", "P6", f"--ptn-expectations={path}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    said = result.stdout.str() + result.stderr.str()
    assert f"{path} is about backend 'broken-x1', and this run tests reference" in said, said


def test_an_entry_that_matches_no_test_is_named_as_a_usage_error(
    pytester: pytest.Pytester, mode: list[str]
) -> None:
    """P6 is a real rule and colliding_literals a real scenario, but no P6 test runs it: the entry would be
    counted as a known failure and never reported. One of a rule the run did not collect is left alone."""
    entry = f'rule = "P6"\nscenario = "colliding_literals"\nreason = "never checked"\nlink = "{LINK}"\n'
    path = expectations_file(pytester, "reference", entry)
    result = run(pytester, "--ptn-backend=reference", "-m", "P6", f"--ptn-expectations={path}", *mode)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    said = result.stdout.str() + result.stderr.str()
    assert "match no test of the suite" in said and f"P6 on colliding_literals ({path})" in said, said
    assert SUITE is not None
    part = run(pytester, "--ptn-backend=reference", "-m", "P9", "-k", "single_method",
               f"--ptn-expectations={path}", str(SUITE / "test_packaging.py"), *mode)  # fmt: skip
    assert part.ret == pytest.ExitCode.OK and part.parseoutcomes().get("passed") == 1, part.stdout.str()


ENTRY = 'backend = "reference"\n\n[[xfail]]\n'


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        (ENTRY + X1_ANY.replace('"X1"', '"Z9"'), "*xfail #1: unknown rule 'Z9'*"),
        (ENTRY + X1_ANY.replace(f'link = "{LINK}"\n', ""), "*xfail #1: missing link*"),
        (
            ENTRY + X1_ANY.replace('"*"', '"no_such_scenario"'),
            "*xfail #1: unknown scenario 'no_such_scenario'*",
        ),
        (X1_ANY, "*'backend' must name the backend*"),
        (ENTRY + "rule = \n", "*"),
        ('backend = "reference"\nrequires = { torch = "not a specifier" }\n', "*requires.torch*"),
        ('backend = "reference"\nxfail = ["X1"]\n', "*'xfail' must be an array of tables*"),
        ('backend = "reference"\nrequires = "torch"\n', "*'requires' must be a table*"),
    ],
    ids=[
        "unknown-rule",
        "missing-link",
        "unknown-scenario",
        "no-backend",
        "bad-toml",
        "bad-specifier",
        "xfail-not-tables",
        "requires-not-a-table",
    ],
)
def test_malformed_expectations_are_a_usage_error_naming_the_file(
    pytester: pytest.Pytester, text: str, complaint: str
) -> None:
    path = pytester.makefile(".toml", bad=text)
    result = run(pytester, "--ptn-backend=reference", "-m", "P6", f"--ptn-expectations={path}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--ptn-expectations: {path}*"])
    result.stderr.fnmatch_lines([complaint])


def test_stale_expectation_on_a_should_rule_fails_the_run(pytester: pytest.Pytester) -> None:
    entry = f'rule = "P9"\nscenario = "single_method"\nreason = "not deterministic"\nlink = "{LINK}"\n'
    path = expectations_file(pytester, "reference", entry)
    result = run(
        pytester,
        "--ptn-backend=reference",
        "-m",
        "P9",
        "-k",
        "single_method",
        f"--ptn-expectations={path}",
        "-rxX",
    )
    result.stdout.no_fnmatch_line("*SHOULD rule P9 not met*")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*XPASS(strict)*stale*"])


# --- several backends in one run --------------------------------------------------------------------------


def test_two_backends_with_one_name_are_lowered_separately(broken: pytest.Pytester) -> None:
    broken.makepyfile(
        ptn_same_name="""
        from broken_backends import NotNamespaced

        class Patched(NotNamespaced):
            name = "reference"  # e.g. a patched copy of an installed backend, run next to it
        """
    )
    broken.syspathinsert()
    result = run(
        broken,
        "--ptn-backend=reference",
        "--ptn-backend=ptn_same_name:Patched",
        "-m",
        "P1",
        "-k",
        "single_method",
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 1 and outcomes.get("failed") == 1, outcomes
    result.stdout.fnmatch_lines(["FAILED *" + glob("[ptn_same_name:Patched-single_method]") + "*"])


# --- xdist: one worker per case ----------------------------------------------------------------------------

COUNT_LOWERINGS = """
import os

from pytest_ptn.harness import Case

_lower_fresh = Case.lower_fresh


def lower_fresh(self):
    with open(os.environ["PTN_LOWERINGS"], "a") as f:
        f.write(f"{os.getpid()} {self.scenario.name}\\n")
    return _lower_fresh(self)


Case.lower_fresh = lower_fresh
"""


def _lowerings(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *mode: str
) -> list[tuple[str, str]]:
    """(process, scenario) of every lowering of a run of two scenarios' tests."""
    from pytest_ptn.harness import Case

    log = pytester.path / f"lowerings{len(mode)}.txt"
    monkeypatch.setenv("PTN_LOWERINGS", str(log))
    monkeypatch.setattr(Case, "lower_fresh", Case.lower_fresh)  # an in-process run patches it: undone after
    result = run(
        pytester,
        "--ptn-backend=reference",
        "-p",
        "ptn_count",
        "-k",
        "(total_collision or kv_cache) and not in_bf16 and not in_fp16",
        *mode,
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    return [(pid, scenario) for pid, scenario in (line.split() for line in log.read_text().splitlines())]


def test_xdist_runs_each_case_on_one_worker(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``-n 2``, every test of a (backend, scenario) goes to one worker, so the run lowers each scenario
    as often as a serial run does (``--dist load`` alone spread them and lowered each on both workers)."""
    pytester.makepyfile(ptn_count=COUNT_LOWERINGS)
    pytester.makeini(f"[pytest]\npythonpath = {pytester.path}\n")
    monkeypatch.syspath_prepend(str(pytester.path))
    serial = _lowerings(pytester, monkeypatch)
    parallel = _lowerings(pytester, monkeypatch, "-n", "2")
    assert sorted(s for _, s in parallel) == sorted(s for _, s in serial)
    workers: dict[str, set[str]] = {}
    for pid, scenario in parallel:
        workers.setdefault(scenario, set()).add(pid)
    assert workers.keys() == {"total_collision", "kv_cache"}
    assert all(len(pids) == 1 for pids in workers.values()), workers


@pytest.mark.parametrize("in_process", [False, True], ids=["one-worker", "in-process"])
def test_tests_that_wait_for_the_clock_run_after_every_case(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, in_process: bool
) -> None:
    """Without -n, P9's tests (a second lowering once the zip clock has moved past the first package) run
    last: the packages they compare with are then seconds old, so they wait for nothing."""
    args = (
        "--ptn-backend=reference",
        "-k",
        "(single_method or colliding_literals) and not in_bf16 and not in_fp16",
    )
    if in_process:
        result = run(pytester, *args, "-v", "-n", "0")
    else:
        monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:randomly")  # the default, one worker
        result = pytester.runpytest_subprocess(*args, "-v", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    done = [
        re.sub(r".*?(test_\w+\.py::\S+).*", r"\1", line) for line in result.stdout.lines if " PASSED" in line
    ]
    clock = [i for i, nodeid in enumerate(done) if "test_lowering_twice_gives_identical_packages" in nodeid]
    assert len(clock) == 2 and len(done) > 10, done
    assert clock == [len(done) - 2, len(done) - 1], done


@pytest.mark.parametrize(
    ("nodeid", "case"),
    [
        ("test_execution.py::test_x[reference-kv_cache]", "reference::kv_cache"),
        (
            "test_package_reader.py::test_x[pte-xnnpack-shared_weight-alias_cycle]",
            "pte-xnnpack::shared_weight",
        ),
        ("test_package_reader.py::test_x[pte-shared_weight]", "pte::shared_weight"),
        ("t.py::test_x[mod.ule:Class-kv_cache]", "mod.ule:Class::kv_cache"),
        ("test_fuzz.py::test_generated_programs_match_eager[reference]", None),
        ("test_x.py::test_plain", None),
        ("test_x.py::test_x[reference-kv_cache_other]", None),
    ],
)
def test_case_of_a_test_id(nodeid: str, case: str | None) -> None:
    from pytest_ptn.scheduling.workers import case_of

    backends = [
        "pte-xnnpack",
        "mod.ule:Class",
        "reference",
        "pte",
    ]  # longest first, as the scheduler has them
    assert case_of(nodeid, backends, ["kv_cache", "shared_weight"]) == case


def test_no_installed_backend_imports_torch_or_executorch_to_say_whether_it_is_available() -> None:
    """The plugin asks requested backends at start-up: importing either costs seconds there."""
    code = (
        "import sys\n"
        "from pytest_ptn.backend import installed_backends\n"
        "for name, entry in sorted(installed_backends().items()):\n"
        "    entry.load().availability()\n"
        "    heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'executorch'))\n"
        "    print(name, *heavy[:3])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    assert {line.split()[0] for line in lines} >= {"reference", "native", "pte", "aoti", "cuda"}
    assert [line for line in lines if len(line.split()) > 1] == []


DRAWING_TEST = """
import json
import os

from hypothesis import given, strategies as st


def test_draws(ptn_fuzz):
    seen = []

    @ptn_fuzz
    @given(st.integers())
    def inner(x):
        seen.append(x)

    inner()
    with open(os.environ["PTN_DRAWS"], "a") as f:
        f.write(json.dumps(seen) + "\\n")
"""


@pytest.mark.parametrize(("profile", "same"), [("ptn-ci", True), ("ptn-nightly", False)])
def test_only_the_nightly_profile_draws_by_the_run_seed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, profile: str, same: bool
) -> None:
    """CI's derandomized profile tests the same programs whatever the seed, so an expected failure it finds
    is found in every run (a seed per run found aoti's known fuzz failure in some runs only: a stale-xfail
    failure in the others); the nightly profile draws by the seed, and the same seed draws the same."""
    pytester.makepyfile(test_draws=DRAWING_TEST)
    draws = pytester.path / "draws.jsonl"
    monkeypatch.setenv("PTN_DRAWS", str(draws))
    for run_seed in (1, 2, 1):
        result = pytester.runpytest_inprocess(
            "test_draws.py",
            "--ptn-backend=reference",
            f"--ptn-fuzz-profile={profile}",
            f"--ptn-seed={run_seed}",
        )
        assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    first, other, again = draws.read_text().splitlines()
    assert first == again
    assert (first == other) is same
