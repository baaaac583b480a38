"""pytest-ptn: a conformance suite for ExecuTorch backends that lower and load multi-method programs.

Importing this package imports neither torch nor executorch; see ``pytest_ptn.plugin``.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
import warnings

from pytest_ptn.spec import Branch, Constant, Method, ProgramSpec, Scenario, Write

DISTRIBUTION = "pytest-ptn"

try:
    __version__ = importlib.metadata.version(DISTRIBUTION)
    """The installed distribution's version: pyproject.toml is its one source."""
except importlib.metadata.PackageNotFoundError:  # a source checkout on PYTHONPATH (air-gapped GPU runner)
    __version__ = "unknown"

MOVED = {
    "comparison": "instruments.comparison",
    "content": "instruments.content",
    "isolation": "instruments.isolation",
    "memory": "instruments.memory",
    "zipdata": "reference.zipdata",
    "session": "run.state",
    "stopping": "run.stopping",
    "hookspecs": "run.hookspecs",
    "inventory": "cli.inventory",
    "skeleton": "cli.skeleton",
    "expectations_update": "cli.expectations_update",
}
"""Modules that moved into folders (old name -> where it lives now, both under pytest_ptn): the old name
still imports, with a DeprecationWarning, until the next release."""


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``pytest_ptn.<old name>`` as the module that now holds it: one module object, two names."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.partition(".")
        return (
            importlib.util.spec_from_loader(fullname, self) if package == __name__ and name in MOVED else None
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = f"{__name__}.{MOVED[spec.name.partition('.')[2]]}"
        warnings.warn(
            f"{spec.name} moved to {new}; the old name goes in the next release", DeprecationWarning, 2
        )
        return importlib.import_module(new)

    def exec_module(self, module: types.ModuleType) -> None:
        """The module was executed under its new name."""


sys.meta_path.append(MovedModules())

__all__ = ["DISTRIBUTION", "Branch", "Constant", "Method", "ProgramSpec", "Scenario", "Write", "__version__"]
