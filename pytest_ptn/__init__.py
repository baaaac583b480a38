"""pytest-ptn: a conformance suite for ExecuTorch backends that lower and load multi-method programs.

Importing this package imports neither torch nor executorch; see ``pytest_ptn.plugin``.
"""

from pytest_ptn.spec import Branch, Constant, Method, ProgramSpec, Scenario, Write

__all__ = ["Branch", "Constant", "Method", "ProgramSpec", "Scenario", "Write"]
