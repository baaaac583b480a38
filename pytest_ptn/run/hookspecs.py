"""The hooks pytest-ptn adds to pytest, for a backend repository's ``conftest.py`` to implement.

Loading this module imports neither torch nor executorch: the plugin registers it at start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_ptn.programs.user import NamedProgram


@pytest.hookspec
def pytest_ptn_programs(config: pytest.Config) -> Sequence[NamedProgram] | None:
    """Your own multi-method programs, run by the conformance suite next to the catalogue's scenarios.

    Return ``pytest_ptn.programs.user.NamedProgram`` objects (each named uniquely), or None. Each
    becomes a scenario with the tags its exported programs earn, so every conformance test that applies runs
    on it.
    Implement it in a ``conftest.py`` pytest loads at start-up (the rootdir's): it is called once, when the
    run is configured, so that expectation files can name the programs.
    """
