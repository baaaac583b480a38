"""The host repository's pytest configuration never changes a verdict.

A backend's repository often has ``filterwarnings = ["error"]`` and ``log_level = "DEBUG"``; the conformance
suite run from there must judge each (backend, scenario) as it does from an empty folder, keep upstream DEBUG
chatter out of its logs, and leave the host's own tests to the host's policy. The noisy backend below warns
and logs the way torch and executorch do, so the policy is checked without executorch; one native run checks
the executorch deprecation that used to fail valid programs.

Runs are subprocesses (the noisy backend changes logger state, ``-W error`` is process-wide), each limited to
one scenario.
"""

from __future__ import annotations

import importlib.util
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_ptn.plugin import suite_path
from pytest_ptn.upstream_noise import SHOW_OPTION

SUITE = suite_path()
SCENARIO = "single_method"
NOISY = "noisy_backend:NoisyBackend"
BACKENDS = ("--ptn-backend=reference", f"--ptn-backend={NOISY}")
QUIET = ("-p", "no:cacheprovider")

NOISY_BACKEND = '''
import logging
import warnings

from pytest_ptn.backends.reference import ReferenceBackend


class NoisyBackend(ReferenceBackend):
    """The reference backend, warning and logging while it lowers as torch and executorch do."""

    name = "noisy"

    def lower(self, programs, workdir):
        logging.getLogger("torch.__trace").debug("TRACE-CHATTER")
        logging.getLogger("executorch.x").info("EXECUTORCH-CHATTER")
        logging.getLogger("executorch.x").warning("EXECUTORCH-WARNING")
        warnings.warn("read_text is deprecated. Use files() instead.", DeprecationWarning)
        return super().lower(programs, workdir)
'''

HOST_CONFIG = """
[tool.pytest.ini_options]
filterwarnings = ["error"]
log_level = "DEBUG"
"""

HOST_TESTS = """
import logging
import warnings

import pytest


def test_host_warning_filters_still_apply():
    with pytest.raises(DeprecationWarning):
        warnings.warn("the host's own deprecation", DeprecationWarning)


def test_host_still_captures_upstream_debug_logs(caplog):
    caplog.set_level(logging.DEBUG, logger="torch.host")
    logging.getLogger("torch.host").debug("host-debug")
    assert caplog.messages == ["host-debug"]
"""

CHATTER = ("TRACE-CHATTER", "EXECUTORCH-CHATTER")


@pytest.fixture
def folders(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """An empty folder, a host repository with its own tests, and the noisy backend importable from both
    (PYTHONPATH is part of the interpreter's start-up path, which xdist workers inherit)."""
    backends = pytester.mkdir("backends")
    (backends / "noisy_backend.py").write_text(NOISY_BACKEND)
    monkeypatch.setenv("PYTHONPATH", str(backends))
    empty = pytester.mkdir("empty")
    host = pytester.mkdir("host")
    (host / "pyproject.toml").write_text(HOST_CONFIG)
    (host / "test_host_own.py").write_text(HOST_TESTS)
    return {"empty": empty, "host": host}


def run_in(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, folder: Path, *args: str
) -> pytest.RunResult:
    monkeypatch.chdir(folder)
    return pytester.runpytest_subprocess(*QUIET, *args, "--junitxml=junit.xml", "-o", "junit_logging=all")


def outcome_counts(result: pytest.RunResult) -> dict[str, int]:
    return {k: n for k, n in result.parseoutcomes().items() if k != "deselected"}


def verdicts(folder: Path) -> dict[str, str]:
    """Conformance test name -> outcome, from the run's JUnit XML."""
    out = {}
    for case in ET.parse(folder / "junit.xml").getroot().iter("testcase"):
        if "[" not in case.get("name", ""):
            continue  # the host's own tests
        outcome = next(
            (child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed"
        )
        out[case.get("name", "")] = outcome
    return out


def test_host_configuration_gives_the_verdicts_of_an_empty_folder(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, folders: dict[str, Path]
) -> None:
    """``-W error``, ``filterwarnings = error`` and ``log_level = DEBUG``, in an xdist worker: the verdicts of
    an empty folder, no upstream chatter in the captured logs, and the workers' warnings counted in one line
    at the end."""
    empty = run_in(pytester, monkeypatch, folders["empty"], *BACKENDS, "-k", SCENARIO)
    assert empty.ret == pytest.ExitCode.OK, empty.stdout.str()
    expected = verdicts(folders["empty"])
    assert {name.split("[", 1)[1].split(f"-{SCENARIO}")[0] for name in expected} == {"reference", NOISY}

    host = run_in(pytester, monkeypatch, folders["host"], *BACKENDS, "-W", "error", "-n", "1", "-k", SCENARIO)
    assert host.ret == pytest.ExitCode.OK, host.stdout.str()
    assert verdicts(folders["host"]) == expected
    captured = (folders["host"] / "junit.xml").read_text()
    assert not [word for word in CHATTER if word in captured]
    assert "EXECUTORCH-WARNING" in captured  # what upstream logs as a warning stays
    assert re.search(
        r"ptn: \d+ upstream warnings while backends lowered, loaded and ran \(.*DeprecationWarning x\d+ "
        rf"from noisy_backend.*\); shown with {SHOW_OPTION}",
        host.stdout.str(),
    ), host.stdout.str()


def test_host_tests_after_the_suite_keep_the_host_policy(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, folders: dict[str, Path]
) -> None:
    """Nothing of the policy outlives a test: the host's tests that run after the suite still see their
    ``error`` filter and upstream DEBUG records, and live DEBUG logs show none of the suite's chatter."""
    result = run_in(
        pytester,
        monkeypatch,
        folders["host"],
        "-c",
        "pyproject.toml",  # the suite's path is given first, to run first; the host's file stays the config
        f"--ptn-backend={NOISY}",
        "--log-cli-level=DEBUG",
        "-k",
        f"test_valid_program_lowers_and_loads and {SCENARIO} or test_host",
        str(SUITE),
        "test_host_own.py",
    )
    assert outcome_counts(result) == {"passed": 3}, result.stdout.str()
    ran = [case.get("name") for case in ET.parse(folders["host"] / "junit.xml").getroot().iter("testcase")]
    assert ran == [
        f"test_valid_program_lowers_and_loads[{NOISY}-{SCENARIO}]",
        "test_host_warning_filters_still_apply",
        "test_host_still_captures_upstream_debug_logs",
    ]
    assert not [word for word in CHATTER if word in result.stdout.str()]
    assert "EXECUTORCH-WARNING" in result.stdout.str()


def test_upstream_logs_option_hands_warnings_and_logs_to_the_host(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, folders: dict[str, Path]
) -> None:
    """With the option the host's policy applies: its ``error`` filter fails the noisy lowering, and the
    chatter is in the live logs."""
    result = run_in(
        pytester,
        monkeypatch,
        folders["host"],
        f"--ptn-backend={NOISY}",
        SHOW_OPTION,
        "--log-cli-level=DEBUG",
        "-k",
        f"test_valid_program_lowers_and_loads and {SCENARIO}",
    )
    assert outcome_counts(result) == {"failed": 1}, result.stdout.str()
    result.stdout.fnmatch_lines(["*lowering failed: DeprecationWarning: read_text is deprecated*"])
    assert all(word in result.stdout.str() for word in CHATTER)
    assert "upstream warnings while" not in result.stdout.str()


@pytest.mark.skipif(importlib.util.find_spec("executorch") is None, reason="needs executorch")
def test_native_lowering_passes_under_the_host_error_filter(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, folders: dict[str, Path]
) -> None:
    """executorch 1.5.1 calls the deprecated ``importlib.resources.read_text`` while lowering: under the
    host's ``filterwarnings = error`` that failed valid programs ("lowering failed: DeprecationWarning")."""
    result = run_in(
        pytester,
        monkeypatch,
        folders["host"],
        "--ptn-backend=native",
        "-k",
        f"test_valid_program_lowers_and_loads and {SCENARIO}",
    )
    assert outcome_counts(result) == {"passed": 1}, result.stdout.str()
    assert re.search(r"DeprecationWarning x\d+ from executorch", result.stdout.str()), result.stdout.str()
    assert "torch.__trace" not in (folders["host"] / "junit.xml").read_text()
