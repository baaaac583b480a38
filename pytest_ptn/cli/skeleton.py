"""``python -m pytest_ptn new-backend NAME [--runtime]``: a backend package to fill in.

It starts as the reference backend under a name of its own, green on the suite as written: ``lower`` is the
reference lowering until it calls your toolchain, and its loader binds constants through
``ReferenceLoaded.bind`` until that calls your loader (the public hooks of pytest_ptn.reference.loader).
With ``--runtime`` it is a runtime of .pte files instead (pytest_ptn.backends.pte_runtime.PteRuntime): the
lowerings are executorch's, and ``load_pte`` is the stub to fill with a call into your runtime. Either
package registers the backend as an entry point and runs the conformance suite beside its own tests
(``ptn_backends`` in pyproject.toml).
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


def runtime_class_name(name: str) -> str:
    return class_name(name).removesuffix("Backend") + "Runtime"


def loaded_class_name(name: str) -> str:
    """The skeleton loader's class, in ``loader.py``: what its ``load`` returns."""
    return class_name(name).removesuffix("Backend") + "Loaded"


def module_and_class(name: str, runtime: bool) -> tuple[str, str]:
    """The package's module holding the skeleton's class (``backend`` or ``runtime``), and the class."""
    return ("runtime", runtime_class_name(name)) if runtime else ("backend", class_name(name))


def entry_point(name: str, runtime: bool) -> str:
    """What makes ``--ptn-backend=NAME`` find the skeleton's class: its entry point, as in pyproject.toml."""
    module, cls = module_and_class(name, runtime)
    return f'[project.entry-points."{ENTRY_POINT_GROUP}"]\n{name} = "{name}_ptn.{module}:{cls}"'


def pyproject(name: str, runtime: bool) -> str:
    return f'''[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}-ptn"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["pytest-ptn"]

{entry_point(name, runtime)}

[tool.setuptools]
packages = ["{name}_ptn"]

[tool.pytest.ini_options]
testpaths = ["tests"]
ptn_backends = ["{name}"]  # the conformance suite runs on it beside tests/
'''


def package_files(name: str, runtime: bool) -> dict[str, str]:
    """What both skeletons hold: pyproject.toml, the package, and the test that the backend can run here."""
    module, cls = module_and_class(name, runtime)
    kind = "runtime of .pte files" if runtime else "backend"
    return {
        "pyproject.toml": pyproject(name, runtime),
        f"{name}_ptn/__init__.py": f'"""The {name} {kind} for pytest-ptn."""\n',
        f"tests/test_{module}.py": f'''\
"""The {module}'s own tests; the conformance suite runs beside them (pyproject.toml)."""

from {name}_ptn.{module} import {cls}


def test_the_{module}_can_run_here() -> None:
    availability = {cls}.availability()
    assert availability.available, availability.reason
''',
    }


def listing(runtime: bool) -> str:
    """The files a skeleton holds, NAME standing for the backend's name: ``new-backend --help`` lists them."""
    return ", ".join(runtime_files("NAME") if runtime else files("NAME"))


def files(name: str) -> dict[str, str]:
    """Path (relative to the new folder) -> text of each file of the skeleton of backend ``name``."""
    package = f"{name}_ptn"
    cls = class_name(name)
    loaded = loaded_class_name(name)
    backend, loader = f"{package}/backend.py", f"{package}/loader.py"
    return {
        **package_files(name, runtime=False),
        backend: f'''\
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

    from {package}.loader import {loaded}


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

    def load(self, lowered: Lowered) -> {loaded}:
        """A fresh, independent copy of a lowered program; `self.cache` lives as long as the backend."""
        from pytest_ptn.reference.loader import ReferenceLowered
        from pytest_ptn.reference.package import read_package

        from {package}.loader import {loaded}

        assert isinstance(lowered, ReferenceLowered)
        return {loaded}(read_package(lowered.path), lowered.graphs, self.cache)
''',
        loader: f'''\
"""The {name} loader: which tensor each method's constant runs with."""

from __future__ import annotations

import torch

from pytest_ptn.reference.loader import ReferenceLoaded


class {loaded}(ReferenceLoaded):
    """One loaded copy of a program; its state is its own, its constants may be shared."""

    def bind(self, method: str, key: str, final: str) -> torch.Tensor:
        """The tensor `method`'s constant `key` runs with (`final`: its name in the package;
        `self.package_tensor(final)`: its bytes; `self.allocate(host)`: a device copy, counted for S6).
        Replace with your loader's look-up. As written: shared across methods by content, never by name."""
        return super().bind(method, key, final)
''',
        "README.md": f"""# {name}-ptn

The `{name}` backend under the pytest-ptn conformance suite.

```
pip install -e .
pytest                              # tests/ and the conformance suite on {name}
pytest --ptn-backend={name} --ptn-report out/    # out/summary.md: causes first, then the matrix
```

Fill in `{cls}.lower` in `{backend}` with your toolchain, and `{loaded}.bind` in
`{loader}` with your loader's look-up. Take a baseline of what fails today with
`python -m pytest_ptn expectations update out/results.json --file {name}.toml` and run with
`--ptn-expectations={name}.toml`.
""",
    }


def runtime_files(name: str) -> dict[str, str]:
    """Path (relative to the new folder) -> text of each file of the skeleton of a runtime of .pte files."""
    package = f"{name}_ptn"
    cls = runtime_class_name(name)
    runtime = f"{package}/runtime.py"
    return {
        **package_files(name, runtime=True),
        runtime: f'''\
"""The {name} runtime of .pte files: fill in `load_pte` with a call into your runtime.

The suite lowers each program with executorch, once per lowering in `lowerings` (each a backend of its own:
`{name}@portable`, `{name}@shared-state`, ...), hands the .pte to `load_pte` and compares what your runtime
computes with eager. Every failure says whose it is: executorch.runtime on the same .pte gives the same
values (the lowering's, or upstream's) or eager's (your runtime's own). Import your runtime inside the
methods: the plugin imports this module whenever pytest starts.
"""

from __future__ import annotations

from pathlib import Path

from pytest_ptn.backend import Availability
from pytest_ptn.backends.pte_runtime import PteRuntime, RuntimeProgram


class {cls}(PteRuntime):
    name = "{name}"
    # the lowerings your runtime supports, of pytest_ptn.backends.pte_runtime.LOWERINGS
    lowerings = ("portable", "shared-state", "external", "xnnpack")

    @classmethod
    def availability(cls) -> Availability:
        """Whether this machine can run your runtime (and executorch, which lowers for it); cheap: import
        nothing heavy here."""
        return super().availability()

    def load_pte(self, program: Path, data: Path | None) -> RuntimeProgram:
        """A fresh copy of the .pte at `program` (`data`: its .ptd, for the external lowering), its state its
        own: anything with `run(method, inputs) -> outputs`, the outputs as executorch's `Method.execute`
        gives them, and `load_method(method)` if your runtime loads methods one by one. A runtime in another
        process returns a proxy that sends the calls there."""
        raise NotImplementedError("{name}: fill in load_pte with your runtime")
''',
        "README.md": f"""# {name}-ptn

The `{name}` runtime of .pte files under the pytest-ptn conformance suite.

```
pip install -e .
pytest                              # tests/ and the conformance suite on every lowering of {name}
pytest --ptn-backend={name}@shared-state --ptn-report out/    # one lowering; out/summary.md: causes first
```

Fill in `{cls}.load_pte` in `{runtime}`, and `lowerings` with those your runtime supports. Take a
baseline of what fails today with `python -m pytest_ptn expectations update out/results.json` (one file
per lowering, `{name}@portable.toml`, ...) and run with `--ptn-expectations=<file>`.
""",
    }


def write(name: str, into: Path, runtime: bool = False) -> list[Path]:
    """Write the skeleton of backend ``name`` (``runtime``: a runtime of .pte files) into the new folder
    ``into / <name>-ptn``; the paths written."""
    if not NAME.match(name):
        raise SkeletonError(
            f"{name!r}: a backend name here is lower case letters, digits and _, a letter first"
        )
    root = into / f"{name}-ptn"
    if root.exists():
        raise SkeletonError(f"{root} exists already: choose another folder or name")
    written = []
    for relative, text in (runtime_files(name) if runtime else files(name)).items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
