"""A repro bundle's standalone reproducer (pytest_ptn.reporting.standalone): run where pytest_ptn cannot be
imported, it shows the wrong values the suite saw and exits 1; on a program pte runs correctly it exits 0.

Two subprocesses, each lowering one small program, and exports of a few catalogue scenarios in this process.
"""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_ptn import upstream_noise
from pytest_ptn.backends.pte import PteBackend
from pytest_ptn.backends.reference import ReferenceBackend
from pytest_ptn.harness import Case
from pytest_ptn.instruments.comparison import close
from pytest_ptn.programs.build import Program
from pytest_ptn.programs.catalogue import BY_NAME
from pytest_ptn.reporting import repro, standalone
from pytest_ptn.spec import Constant, Method, ProgramSpec

FAILING = "private_same_shape_buffers"
"""Listed as failing on pte (E4): the two methods' private states share one arena slot."""

CORRECT = ProgramSpec(
    methods=(
        Method("a", (Constant("w", "parameter", shape=(5, 4), seed=1),), reads=("w",)),
        Method("b", (Constant("w", "parameter", shape=(5, 4), seed=1, nudged=(7,)),), reads=("w",)),
    ),
    calls=("a", "b", "a"),
)
"""Near-equal weights under one name, which pte keeps apart; long enough to be written as bytes."""

FEATURES = (
    "eight_methods",
    "torchao_int8_weights",
    "kv_cache_in_bf16",
    "write_only_buffer",
    "input_mutation",
    "cond_constants",
    "aliased_submodule",
    "quantized_cache",
    "equal_bytes_two_dtypes",
    "nested_layers",
    "per_layer_caches",
    "tied_output_layer",
    "tied_across_methods",
    "strided_weights",
)
"""Catalogue scenarios that between them hold every family, write, dtype, program form, nesting, layout and
tie."""

BLOCKED = (
    "import runpy, sys; sys.modules['pytest_ptn'] = None; "  # `import pytest_ptn` raises ImportError
    "import importlib.util; "
    "assert importlib.util.find_spec('pytest_ptn') is None; "
    "sys.argv = [sys.argv[1]]; runpy.run_path(sys.argv[0], run_name='__main__')"
)
"""Runs a script in an isolated interpreter (``-I``: no project folder, no PYTHONPATH) where importing
pytest_ptn fails, although the venv has it installed (editable)."""


def run_alone(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-c", BLOCKED, str(script)],
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )


def pte_wrong_values(spec: ProgramSpec, workdir: Path) -> set[str]:
    """Each output element pte gets wrong, as the standalone file prints it, by the suite's own lowering
    (each method loaded at its first call, as the harness loads)."""
    program = Program(spec)
    backend = PteBackend()
    with upstream_noise.contained():
        loaded = backend.load(backend.lower(program.export(), workdir))
        ran = [loaded.run(call.method, [t.clone() for t in call.inputs])[0] for call in program.eager()]
    found = set()
    for i, (call, have) in enumerate(zip(program.eager(), ran, strict=True)):
        want = call.outputs[0]
        for k in (~close(have, want).reshape(-1)).nonzero().reshape(-1).tolist():
            h, w = have.reshape(-1)[k].item(), want.reshape(-1)[k].item()
            found.add(f"call #{i} {call.method}() output 0[{k}] = {h!r}, eager {w!r}")
    return found


def written(spec: ProgramSpec, folder: Path, name: str) -> Path:
    folder.mkdir()
    standalone.write(folder, PteBackend(), name, spec)
    return folder / standalone.FILE


def test_a_failing_program_shows_the_same_wrong_values_without_pytest_ptn(tmp_path: Path) -> None:
    spec = BY_NAME[FAILING].spec
    expected = pte_wrong_values(spec, tmp_path)
    assert expected, f"{FAILING} no longer fails on pte"
    done = run_alone(written(spec, tmp_path / "bundle", FAILING))
    shown = {line.strip() for line in done.stdout.splitlines()}
    assert done.returncode == 1, done.stdout + done.stderr
    assert expected <= shown, done.stdout


def test_a_program_pte_runs_correctly_exits_zero(tmp_path: Path) -> None:
    script = written(CORRECT, tmp_path / "bundle", "near_equal")
    assert 'tensor("' in script.read_text()  # the (5, 4) weights, as bytes
    done = run_alone(script)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all match eager: fixed" in done.stdout


def loaded_script(path: Path) -> dict[str, Any]:
    with upstream_noise.contained():
        return runpy.run_path(str(path), run_name="standalone")


@pytest.mark.parametrize("name", FEATURES)
def test_the_file_holds_the_program_the_suite_exports(tmp_path: Path, name: str) -> None:
    """Same inputs, same eager outputs exactly, and the same exported graphs and constant names: the file
    lowers the program the suite lowered."""
    spec = BY_NAME[name].spec
    script = loaded_script(written(spec, tmp_path / "bundle", name))
    program = Program(spec)
    modules = script["build"]()
    with torch.no_grad():
        for (method, x), call in zip(script["CALLS"], program.eager(), strict=True):
            assert method == call.method and torch.equal(x, call.inputs[0])
            assert torch.equal(modules[method](x.clone()), call.outputs[0])
    theirs = program.export()
    with upstream_noise.contained():
        for method, module in script["build"]().items():
            example = torch.zeros(script["INPUT_SHAPES"][method], dtype=getattr(torch, spec.dtype))
            ep = torch.export.export(module, (example,), strict=False)
            assert str(ep.graph_signature) == str(theirs[method].graph_signature)
            assert ep.graph_module.code == theirs[method].graph_module.code
            assert sorted(ep.constants) == sorted(theirs[method].constants)
            for key, t in theirs[method].state_dict.items():  # laid out alike, tied alike
                mine = ep.state_dict[key]
                assert (mine.stride(), mine.storage_offset()) == (t.stride(), t.storage_offset()), key
                assert mine.untyped_storage().nbytes() == t.untyped_storage().nbytes(), key


def test_a_bundle_names_its_reproducer_or_says_why_it_has_none(tmp_path: Path) -> None:
    for backend, wanted in (
        (PteBackend(), "standalone reproducer (torch"),
        (ReferenceBackend(), "no standalone"),
    ):
        case = Case(backend, BY_NAME[FAILING], lambda name: tmp_path / name)
        (tmp_path / backend.name).mkdir()
        bundle = repro.write_bundle(tmp_path / backend.name, backend.name, case, {})
        said = json.loads((bundle / repro.MANIFEST).read_text())[repro.STANDALONE]
        assert said.startswith(wanted)
        assert (bundle / standalone.FILE).exists() == (backend.name == "pte")
