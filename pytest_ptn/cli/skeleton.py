"""``python -m pytest_ptn new-backend NAME``: a backend package to fill in, green on the suite as written.

It starts as the reference backend under a name of its own: ``lower`` is the reference lowering until it
calls your toolchain, and its loader binds constants through ``ReferenceLoaded.bind`` until that calls
your loader (the public hooks of pytest_ptn.reference.loader). The package registers the backend as an
entry point and runs the conformance suite beside its own tests (``ptn_backends`` in pyproject.toml).
"""

from __future__ import annotations

import re
from pathlib import Path

from pytest_ptn.backend import ENTRY_POINT_GROUP

NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
"""A backend name that is also a Python identifier, so the package is ``<name>_ptn``."""


class SkeletonError(ValueError):
    """A name the skeleton cannot use, or a folder that already holds one."""


def class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_")) + "Backend"


def files(name: str) -> dict[str, str]:
    """Path (relative to the new folder) -> text of each file of the skeleton of backend ``name``."""
    package = f"{name}_ptn"
    cls = class_name(name)
    return {
        "pyproject.toml": f'''[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}-ptn"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["pytest-ptn"]

[project.entry-points."{ENTRY_POINT_GROUP}"]
{name} = "{package}.backend:{cls}"

[tool.setuptools]
packages = ["{package}"]

[tool.pytest.ini_options]
testpaths = ["tests"]
ptn_backends = ["{name}"]  # the conformance suite runs on it beside tests/
''',
        f"{package}/__init__.py": f'"""The {name} backend for pytest-ptn."""\n',
        f"{package}/backend.py": f'''\
"""The {name} backend: fill in `lower` with your toolchain (and `loader.py` with your loader).

As written it is the reference backend under another name, so the suite is green before you start; each
step you replace with your own shows what your code changes. torch is imported inside the methods: the
plugin imports this module whenever pytest starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pytest_ptn.backend import Availability, Capability, Lowered, package_version
from pytest_ptn.backends.reference import ReferenceBackend

if TYPE_CHECKING:
    import torch

    from {package}.loader import {cls[: -len("Backend")]}Loaded


class {cls}(ReferenceBackend):
    name = "{name}"
    # drop those your backend cannot show (see `list rules`); QUANTIZE only with a quantize() of your own
    capabilities = frozenset(Capability) - {{Capability.QUANTIZE}}

    @classmethod
    def availability(cls) -> Availability:
        """Whether this machine can run the backend; cheap: import nothing heavy here."""
        return Availability(True, versions={{"torch": package_version("torch") or "?"}})

    def lower(self, programs: dict[str, torch.export.ExportedProgram], workdir: Path) -> Lowered:
        """Lower every method of the program (method name -> ExportedProgram) into files under `workdir`.
        Replace with your toolchain; as written, the reference lowering."""
        return super().lower(programs, workdir)

    def load(self, lowered: Lowered) -> {cls[: -len("Backend")]}Loaded:
        """A fresh, independent copy of a lowered program; `self.cache` lives as long as the backend."""
        from pytest_ptn.reference.loader import ReferenceLowered
        from pytest_ptn.reference.package import read_package

        from {package}.loader import {cls[: -len("Backend")]}Loaded

        assert isinstance(lowered, ReferenceLowered)
        return {cls[: -len("Backend")]}Loaded(read_package(lowered.path), lowered.graphs, self.cache)
''',
        f"{package}/loader.py": f'''\
"""The {name} loader: which tensor each method's constant runs with."""

from __future__ import annotations

import torch

from pytest_ptn.reference.loader import ReferenceLoaded


class {cls[: -len("Backend")]}Loaded(ReferenceLoaded):
    """One loaded copy of a program; its state is its own, its constants may be shared."""

    def bind(self, method: str, key: str, final: str) -> torch.Tensor:
        """The tensor `method`'s constant `key` runs with (`final`: its name in the package;
        `self.package_tensor(final)`: its bytes; `self.allocate(host)`: a device copy, counted for S6).
        Replace with your loader's look-up. As written: shared across methods by content, never by name."""
        return super().bind(method, key, final)
''',
        "tests/test_backend.py": f'''\
"""The backend's own tests; the conformance suite runs beside them (pyproject.toml)."""

from {package}.backend import {cls}


def test_the_backend_can_run_here() -> None:
    availability = {cls}.availability()
    assert availability.available, availability.reason
''',
        "README.md": f"""# {name}-ptn

The `{name}` backend under the pytest-ptn conformance suite.

```
pip install -e .
pytest                              # tests/ and the conformance suite on {name}
pytest --ptn-backend={name} --ptn-report out/    # out/summary.md: causes first, then the matrix
```

Fill in `lower` and `{cls}Loaded.bind` in `{package}/backend.py`. Take a baseline of what fails today with
`python -m pytest_ptn expectations update out/results.json --file {name}.toml` and run with
`--ptn-expectations={name}.toml`.
""",
    }


def write(name: str, into: Path) -> list[Path]:
    """Write the skeleton of backend ``name`` into the new folder ``into / <name>-ptn``; the paths written."""
    if not NAME.match(name):
        raise SkeletonError(
            f"{name!r}: a backend name here is lower case letters, digits and _, a letter first"
        )
    root = into / f"{name}-ptn"
    if root.exists():
        raise SkeletonError(f"{root} exists already: choose another folder or name")
    written = []
    for relative, text in files(name).items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
