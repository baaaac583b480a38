"""Repro bundles (``--ptn-repro DIR``): one folder per failing (backend, scenario) that an engineer who never
saw the run can replay.

The worker that ran the failing test writes it, from the test's Case (the fuzz test: one from each program
it failed on, one per unlisted mechanism): the files the backend wrote (``Lowered.files``), the call
sequence with every input and eager output, and for a bf16 or fp16 program the float64 eager run the
comparison's bound is made from (``calls.safetensors``: a replay compares as the suite did), the program as
a pasteable test, the failure text and ``repro.py``, which loads the bundled artifact through the backend,
replays the calls, checks the sharing topology where the backend shows one, loads the methods in reverse
order and replays again, and exits 1 while any of it differs. A backend adds its own scripts
(``Lowered.bundle_scripts``: a ``.pte`` gets the replay through ``executorch.runtime`` alone); a generated
or catalogue program on a ``.pte`` backend gets ``standalone.py``, which needs torch and executorch only
(pytest_ptn.reporting.standalone). No file is named as pytest collects tests (``test_*.py``,
``*_test.py``), so a bundle folder inside a project is never collected by its next run.
"""

from __future__ import annotations

import hashlib
import json
import pprint
import re
import shutil
import sys
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_ptn.backend import WIDE_RUN
from pytest_ptn.reporting import standalone
from pytest_ptn.run.state import FAILING_PROGRAMS, RUN_STATE

if TYPE_CHECKING:
    import torch

    from pytest_ptn.backend import EagerCall, Lowered
    from pytest_ptn.harness import Case
    from pytest_ptn.spec import ProgramSpec

OPTION = "--ptn-repro"
MANIFEST = "bundle.json"
"""In every bundle: what it holds (backend, scenario, versions, artifact files), and the mark that a folder
is a bundle."""
ARTIFACT = "artifact"
CALLS = "calls.safetensors"
FAILURE = "failure.txt"
PROGRAM_TEST = "reproducer.py"
"""The program as a test to paste into a backend's own suite; named so that pytest does not collect it."""
REPRO_SCRIPT = "repro.py"
STANDALONE = "standalone"
"""In the manifest: the line that names the bundle's standalone reproducer, or says why it has none."""
REPORT_SECTION = "ptn repro bundle"

CASE_FIXTURE = "ptn_case"
BACKEND_PARAM = "ptn_backend"


def add_option(group: pytest.OptionGroup) -> None:
    group.addoption(
        OPTION,
        metavar="DIR",
        default=None,
        help="write a repro bundle to DIR for every failing (backend, scenario): the lowered artifact, the "
        "calls with eager inputs and outputs (safetensors), the program, the failure and a repro.py that "
        "replays it without pytest",
    )


def configure(config: pytest.Config) -> None:
    """Every process that runs tests writes the bundles of its failures; the controller first clears the
    bundles an earlier run left in DIR, so each folder there is a case that failed in this run."""
    value = config.getoption("ptn_repro")
    if value is None:
        return
    folder = Path(config.invocation_params.dir, value).resolve()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not hasattr(config, "workerinput"):
            for old in folder.glob(f"*/{MANIFEST}"):
                shutil.rmtree(old.parent)
    except OSError as e:
        raise pytest.UsageError(f"{OPTION} {value}: cannot write there: {e.strerror or e}") from e
    config.pluginmanager.register(BundleWriter(folder), "ptn-repro")


class BundleWriter:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """Outermost, so it sees the verdict after xfail and SHOULD handling: a known failure gets a bundle
        too (it is still a bug for someone to fix); a skip does not."""
        report = yield
        failed = report.failed or hasattr(report, "wasxfail")
        if report.when != "call" or call.excinfo is None or not failed:
            return report
        for case in failing_cases(item):
            spec = item.callspec.params[BACKEND_PARAM]  # type: ignore[attr-defined]
            versions = item.config.stash[RUN_STATE].availability[spec].versions
            bundle = write_bundle(self.folder, spec, case, versions)
            verdict = (
                f"{report.wasxfail}\n" if hasattr(report, "wasxfail") else ""
            )  # a known failure, a SHOULD
            with (bundle / FAILURE).open("a") as f:
                f.write(f"{item.nodeid}\n{verdict}{report.longreprtext}\n\n")
            reproducer = standalone.line(bundle, standalone.reason(case.backend, case.scenario))
            report.sections.append((REPORT_SECTION, f"{bundle}\n{reproducer}"))
        return report


def failing_cases(item: pytest.Item) -> list[Case]:
    """The case a failed test ran: its ``ptn_case``, or for the fuzz test one per program it failed on
    (one per unlisted mechanism: ``fuzz``, ``fuzz-2``, ...)."""
    from pytest_ptn.harness import Case

    funcargs = getattr(item, "funcargs", {})
    case = funcargs.get(CASE_FIXTURE)
    if isinstance(case, Case):
        return [case]
    programs = item.stash.get(FAILING_PROGRAMS, [])
    backend = funcargs.get(BACKEND_PARAM)
    if backend is None:
        return []
    from pytest_ptn.expectations import FUZZ_SCENARIO
    from pytest_ptn.spec import Scenario

    names = [FUZZ_SCENARIO, *(f"{FUZZ_SCENARIO}-{i}" for i in range(2, len(programs) + 1))]
    return [
        Case(backend, Scenario(scenario, "", program), lambda name: Path(tempfile.mkdtemp(prefix=name)))
        for scenario, program in zip(names, programs, strict=True)
    ]


def write_bundle(root: Path, spec: str, case: Case, versions: dict[str, str]) -> Path:
    """The bundle folder of ``case`` (run as backend ``spec``), written by the first of its failing tests
    to get here. A user program is not data, so its bundle has no program test and no repro.py."""
    from pytest_ptn.strategies import reproducer  # hypothesis: not at plugin load

    bundle = root / re.sub(r"[^\w.-]+", "_", f"{spec}-{case.scenario.name}")
    try:
        bundle.mkdir()
    except FileExistsError:
        return bundle
    lowering = case.lowering()
    lowered = lowering if lowering is not None and not isinstance(lowering, Exception) else None
    artifact = copy_artifact(lowered, bundle / ARTIFACT) if lowered is not None else {}
    spec_of_program = case.catalogue_spec
    why = standalone.reason(case.backend, case.scenario)
    if why is None and spec_of_program is not None:
        standalone.write(bundle, case.backend, case.scenario.name, spec_of_program)
    manifest = {
        "backend": spec,
        "scenario": case.scenario.name,
        "versions": versions,
        ARTIFACT: artifact,
        STANDALONE: standalone.line(bundle, why),
    }
    (bundle / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    write_calls(bundle / CALLS, case.eager())
    if spec_of_program is not None:
        (bundle / PROGRAM_TEST).write_text(reproducer(spec_of_program))
        (bundle / REPRO_SCRIPT).write_text(
            repro_script(spec, type(case.backend), case.scenario.name, spec_of_program)
        )
    if lowered is not None:
        in_bundle = {attribute: f"{ARTIFACT}/{name}" for attribute, name in artifact.items()}
        for name, text in lowered.bundle_scripts(CALLS, in_bundle, case.eager()).items():
            (bundle / name).write_text(text)
    return bundle


def copy_artifact(lowered: Lowered, into: Path) -> dict[str, str]:
    """Copy what the backend wrote (``Lowered.files``); the names, by attribute."""
    into.mkdir()
    files = lowered.files()
    for source in files.values():
        if source.is_dir():
            shutil.copytree(source, into / source.name)
        else:
            shutil.copy2(source, into / source.name)
    return {attribute: source.name for attribute, source in files.items()}


def write_calls(path: Path, calls: list[EagerCall]) -> None:
    """Each call's tensors as ``<call>/<field>/<index>`` (``<fqn>`` for ``state_after``), the method names
    in the metadata; a reduced-precision program's float64 run (EagerCall.wide) under ``WIDE_RUN/``, so that a
    replay compares with the bound the suite used (pytest_ptn.instruments.comparison)."""
    from safetensors.torch import save_file

    tensors = {}
    for i, call in enumerate(calls):
        for prefix, run in ((f"{i}/", call), (f"{WIDE_RUN}/{i}/", call.wide)):
            if run is None:
                continue
            fields: dict[str, dict[str, torch.Tensor]] = {
                "inputs": {str(j): t for j, t in enumerate(run.inputs)},
                "outputs": {str(j): t for j, t in enumerate(run.outputs)},
                "inputs_after": {str(j): t for j, t in enumerate(run.inputs_after)},
                "state_after": run.state_after,
            }
            for field, values in fields.items():
                for name, t in values.items():
                    tensors[f"{prefix}{field}/{name}"] = t.detach().clone().contiguous()
    save_file(tensors, path, metadata={"methods": json.dumps([c.method for c in calls])})


def read_calls(path: Path) -> list[EagerCall]:
    """The calls ``write_calls`` wrote, each with its float64 run where the bundle has one."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from pytest_ptn.backend import EagerCall

    with safe_open(path, "pt") as f:
        methods = json.loads(f.metadata()["methods"])
    tensors = load_file(path)

    def under(prefix: str) -> dict[str, torch.Tensor]:
        return {k.removeprefix(prefix): t for k, t in tensors.items() if k.startswith(prefix)}

    def indexed(prefix: str) -> list[torch.Tensor]:
        found = under(prefix)
        return [found[k] for k in sorted(found, key=int)]

    def call(method: str, prefix: str) -> EagerCall:
        return EagerCall(
            method,
            tuple(indexed(f"{prefix}inputs/")),
            indexed(f"{prefix}outputs/"),
            tuple(indexed(f"{prefix}inputs_after/")),
            under(f"{prefix}state_after/"),
        )

    calls = []
    for i, method in enumerate(methods):
        read = call(method, f"{i}/")
        if under(f"{WIDE_RUN}/{i}/"):
            read.wide = call(method, f"{WIDE_RUN}/{i}/")
        calls.append(read)
    return calls


def bundled_lowered(case: Case, bundle: Path) -> Lowered:
    """The backend's lowering of the case's program, pointed at the bundled file(s): a backend may keep
    part of a lowering in memory (graphs, signatures), so the program is lowered again for that part, and
    the files the failing run wrote are the ones loaded."""
    lowered = case.lower_fresh()
    artifact = json.loads((bundle / MANIFEST).read_text())[ARTIFACT]
    if not artifact:
        print("no artifact in the bundle (the failing test did not lower the case): replaying a new lowering")
        return lowered
    if _digest(lowered.path) != _digest(bundle / ARTIFACT / artifact["path"]):
        print("note: lowering again wrote other bytes than the bundled artifact; replaying the bundled one")
    for attribute, name in artifact.items():
        setattr(lowered, attribute, bundle / ARTIFACT / name)
    return lowered


def _digest(path: Path) -> str | None:
    """sha256 of a file artifact (None for a folder: not compared)."""
    if not path.is_file():
        return None
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def import_root(cls: type) -> str | None:
    """The sys.path entry a ``module:Class`` backend was imported from, so repro.py finds it from any
    folder on this machine (None for a module without a file)."""
    module = sys.modules[cls.__module__]
    if module.__file__ is None:
        return None
    file = Path(module.__file__).resolve()
    depth = cls.__module__.count(".") + (file.name == "__init__.py")
    return str(file.parents[depth])


def replay(case: Case, lowered: Lowered, calls: list[EagerCall]) -> list[str]:
    """Every way the bundled lowering still fails, as lines to print (none: it passes): the calls replayed
    on a fresh load (E1, E3-E5), the sharing topology where the backend shows one (S1-S3), and the methods
    loaded in reverse order (S5): topology and calls again. Through the backend the case failed on; where it
    has a witness (a runtime of .pte files: executorch.runtime), each difference says what the witness gives
    on the same bundled file."""
    from pytest_ptn.backend import Capability

    lines: list[str] = []
    case.replaying(lowered)
    mismatches = case.run_sequence(case.loader.load(lowered), calls)
    if mismatches:
        lines += ["outputs differ from eager:", *(f"  {m}" for m in mismatches)]
    names = list(case.program.method_names)
    backward = case.loader.load(lowered)
    for method in reversed(names):
        backward.load_method(method)
    if Capability.STORAGE in case.backend.capabilities:
        from pytest_ptn.check.storage import partition, storage_findings, topology

        programs = case.exported()
        forward = case.loader.load(lowered)
        for method in names:
            forward.load_method(method)
        storages = topology(forward, programs)
        wrong = storage_findings(storages, programs)
        if wrong:
            lines += ["the loader's sharing topology is wrong:", *(f"  {f}" for f in wrong)]
        if partition(topology(backward, programs)) != partition(storages):
            lines.append("the sharing topology depends on the order methods load in (S5)")
    reverse = case.run_sequence(backward, calls)
    if reverse and not mismatches:
        lines += [
            "outputs differ from eager when methods load in reverse order:",
            *(f"  {m}" for m in reverse),
        ]
    return lines


def repro_script(spec: str, cls: type, scenario: str, program_spec: ProgramSpec) -> str:
    root = import_root(cls) if ":" in spec else None
    program = pprint.pformat(program_spec, width=100).replace("\n", "\n" + " " * len("SPEC = "))
    return f'''"""Replays {spec} x {scenario}, a case that failed under pytest-ptn (see {FAILURE}).

Needs torch (executorch for an executorch backend), the backend's own package and pytest-ptn, not the run:
`python {REPRO_SCRIPT}` from any folder. The program is lowered again only for what the backend keeps beside
its file; the bundled artifact is what gets loaded, through {spec}. It replays the calls, checks the sharing
topology (where the backend shows one) and loads the methods in reverse order; every difference is printed
(for a runtime of .pte files, with what executorch.runtime gives on the bundled file), and the exit status
is 1 while there is one.
"""

import sys
import tempfile
import traceback
from pathlib import Path

from pytest_ptn import *  # noqa: F403  ProgramSpec and its parts
from pytest_ptn.backend import resolve_backend
from pytest_ptn.harness import Case
from pytest_ptn.reporting.repro import bundled_lowered, read_calls, replay

BACKEND = {spec!r}
BACKEND_IMPORT_ROOT = {root!r}
SCENARIO = {scenario!r}
SPEC = {program}


def main() -> int:
    here = Path(__file__).resolve().parent
    if BACKEND_IMPORT_ROOT is not None:
        sys.path.append(BACKEND_IMPORT_ROOT)
    backend = resolve_backend(BACKEND)()
    with tempfile.TemporaryDirectory() as scratch:
        case = Case(backend, Scenario(SCENARIO, "", SPEC), lambda name: Path(tempfile.mkdtemp(dir=scratch)))
        try:
            found = replay(case, bundled_lowered(case, here), read_calls(here / {CALLS!r}))
        except Exception:
            traceback.print_exc()
            print(f"{{BACKEND}} x {{SCENARIO}} fails: the backend raised (above)")
            return 1
    if not found:
        print(f"{{BACKEND}} x {{SCENARIO}}: every call matches eager and the sharing topology holds: fixed?")
        return 0
    print("\\n".join(found))
    return 1


if __name__ == "__main__":
    sys.exit(main())
'''
