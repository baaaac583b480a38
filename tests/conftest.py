import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

EXTRAS = {
    "openvino": ("openvino", "nncf"),
    "hf": ("optimum.exporters.executorch",),
    "arm": ("tosa_serializer", "tosa_reference_model", "ethosu.vela"),
}
"""pyproject's optional extras that tests need, by the modules each installs: a test marked
``@pytest.mark.extra(NAME)`` skips, naming the extra, where they are missing, so the README's install line
gives the same verdicts as one with every extra (.ci/run runs ``-m extra`` again once they are in, the arm
extra's in a venv of its own: .ci/arm_tests.sh)."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "extra(name): needs the optional extra NAME; skipped, naming it, where it is missing"
    )


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, a dotted one too (whose parent package may be missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("extra"):
        (name,) = mark.args
        missing = [m for m in EXTRAS[name] if not installed(m)]
        if missing:
            pytest.skip(
                f"needs the {name} extra ({', '.join(missing)} not installed): "
                f"pip install -e '.[test,executorch,{name}]'"
            )


@pytest.fixture(scope="session")
def warm_torch() -> None:
    """Lower and run one program before any in-process pytester run.

    ``runpytest_inprocess`` drops the modules a run imported; torch imports many lazily during the first
    export, and a half-dropped torch breaks exports in later runs. Importing them up front keeps them.
    """
    import tempfile

    from pytest_ptn.backends.reference import ReferenceBackend
    from pytest_ptn.harness import Case
    from pytest_ptn.programs.catalogue import BY_NAME

    # torchao's weights import modules that register operators: imported again after a run dropped them,
    # they raise "duplicate registrations" or "Only a single TORCH_LIBRARY can be used"
    for scenario in ("cond_constants", "torchao_int8_weights"):
        with tempfile.TemporaryDirectory() as tmp:
            case = Case(ReferenceBackend(), BY_NAME[scenario], lambda name: Path(tmp))
            case.run_sequence(case.load())
            case.exported()


@pytest.fixture(autouse=True)
def in_process_runs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """pytester runs of this project's tests are in-process (``-n 0``) unless they pass ``-n`` themselves,
    and in collection order.

    A conformance run without ``-n`` goes to one crash-isolating xdist worker; that default path has its own
    tests (test_crash_isolation.py), and a worker per run would only make every other plugin test slower:
    those set ``PYTEST_ADDOPTS`` to ``-p no:randomly`` alone. pytest-randomly (the test extra) would shuffle
    every pytester run, which this project's addopts do not reach; test_other_plugins.py turns it on.
    """
    if "pytester" in request.fixturenames:
        # A run in this process drops the modules it imported: torch's, imported half by a first run and
        # dropped, made later lowerings fail ("SystemError: ... bad call flags") or crash the worker.
        request.getfixturevalue("warm_torch")
        request.getfixturevalue("pytester")  # it clears PYTEST_ADDOPTS when it starts
        monkeypatch.setenv("PYTEST_ADDOPTS", "-n 0 -p no:randomly")
