"""A listed crash or hang costs its program only: the fuzz judges each program in a child of its own and goes
on (pytest_ptn.fuzzing.apart); an unlisted one fails the test naming the signal, the step and the program."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from pytest_ptn.instruments.process_end import ProcessEnd
from pytest_ptn.mechanisms import Step, crashed, hung


def test_a_crash_key_is_the_step_and_the_signal() -> None:
    assert crashed(Step.RUNNING, ProcessEnd.of(-signal.SIGSEGV)).key == "crash:running:SIGSEGV"
    assert crashed(Step.LOWERING, ProcessEnd.of(3)).key == "crash:lowering:status"
    assert hung(Step.RUNNING).key == "hang:running"


def _known(path: Path, mechanism: str) -> Path:
    file = path / "known.toml"
    file.write_text(
        f'backend = "dying"\n[[xfail]]\nrule = "E1"\nscenario = "fuzz"\nmechanism = "{mechanism}"\n'
        'reason = "its loader dies on programs of three or four methods"\nlink = ""\n'
    )
    return file


@pytest.mark.parametrize(
    ("variant", "mechanism", "options"),
    [
        ("SegfaultsOnThreeMethods", "crash:running:SIGSEGV", []),
        ("HangsOnFourMethods", "hang:running", ["--ptn-timeout=10"]),
    ],
)
def test_a_listed_crash_or_hang_costs_its_program_only(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    variant: str,
    mechanism: str,
    options: list[str],
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    known = _known(pytester.path, mechanism)
    # on two workers, a share of the programs each (one fuzz item per worker): a hung program waits out the
    # limit, and the other worker's share goes on meanwhile
    result = pytester.runpytest_subprocess(
        f"--ptn-backend=dying_reference:{variant}",
        "-k",
        "fuzz",
        f"--ptn-expectations={known}",
        "-n",
        "2",
        *options,
    )
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert f"{mechanism} x" in out, out  # the tally counts the programs it cost, and the fuzz went on
    assert "clean" in out


def test_an_unlisted_crash_fails_naming_signal_step_and_program(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:randomly")  # the default: crash isolation on
    result = pytester.runpytest_subprocess(
        "--ptn-backend=dying_reference:SegfaultsOnThreeMethods", "-k", "fuzz", "--ptn-no-expectations"
    )
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "killed by SIGSEGV" in out and "while loading" in out and "def test_reproducer" in out, out
