import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def warm_torch() -> None:
    """Lower and run one program before any in-process pytester run.

    ``runpytest_inprocess`` drops the modules a run imported; torch imports many lazily during the first
    export, and a half-dropped torch breaks exports in later runs. Importing them up front keeps them.
    """
    import tempfile

    from pytest_ptn.backends.reference import ReferenceBackend
    from pytest_ptn.catalogue import BY_NAME
    from pytest_ptn.harness import Case

    with tempfile.TemporaryDirectory() as tmp:
        case = Case(ReferenceBackend(), BY_NAME["cond_constants"], lambda name: Path(tmp), {}, {})
        case.run_sequence(case.load())
        case.exported()
