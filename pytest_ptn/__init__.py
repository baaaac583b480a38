"""pytest-ptn: a conformance suite for ExecuTorch backends that lower and load multi-method programs.

Importing this package imports neither torch nor executorch; see ``pytest_ptn.plugin``.
"""

import importlib.metadata

from pytest_ptn.spec import Branch, Constant, Method, ProgramSpec, Scenario, Write

DISTRIBUTION = "pytest-ptn"

try:
    __version__ = importlib.metadata.version(DISTRIBUTION)
    """The installed distribution's version: pyproject.toml is its one source."""
except importlib.metadata.PackageNotFoundError:  # a source checkout on PYTHONPATH (air-gapped GPU runner)
    __version__ = "unknown"

__all__ = ["DISTRIBUTION", "Branch", "Constant", "Method", "ProgramSpec", "Scenario", "Write", "__version__"]
