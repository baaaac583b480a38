"""``python -m pytest_ptn new-backend [--runtime]``: a package an author fills in with public hooks only, and
the suite then judges what they wrote."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_ptn.backend import LOWERING_FAULT, RUNTIME_FAULT
from pytest_ptn.cli import skeleton
from pytest_ptn.cli.main import main
from pytest_ptn.plugin import suite_path
from pytest_ptn.reporting import repro

AS_WRITTEN = "        return super().bind(method, key, final)\n"
BY_NAME = """\
        if self.by_name is None:
            self.by_name = {}
        if key not in self.by_name:  # the first method to load a name wins
            self.by_name[key] = super().bind(method, key, final)
        return self.by_name[key]

    by_name: dict[str, torch.Tensor] | None = None
"""


def test_a_skeleton_with_a_by_name_cache_fails_the_rules_it_breaks(
    pytester: pytest.Pytester, warm_torch: None
) -> None:
    assert main(["new-backend", "mine", "--into", str(pytester.path)]) == 0
    root = pytester.path / "mine-ptn"
    assert 'mine = "mine_ptn.backend:MineBackend"' in (root / "pyproject.toml").read_text()
    loader = root / "mine_ptn" / "loader.py"
    assert AS_WRITTEN in loader.read_text()
    loader.write_text(loader.read_text().replace(AS_WRITTEN, BY_NAME))
    code = "".join(p.read_text() for p in (root / "mine_ptn").glob("*.py"))
    assert not re.search(r"\._[a-z]", code), "the skeleton needs no private name"
    pytester.syspathinsert(root)
    result = pytester.runpytest_inprocess(
        str(suite_path()),
        "--ptn-backend=mine_ptn.backend:MineBackend",
        "-m",
        "P1 or E1 or S2 or S5",
        "-k",
        "colliding_tensor_constants",
        "-p",
        "no:cacheprovider",
        "--ptn-report",
        "out",
    )
    rows = json.loads((pytester.path / "out" / "results.json").read_text())["results"]
    outcomes = {r["rule"]: r["outcome"] for r in rows}
    assert outcomes == {"P1": "pass", "E1": "fail", "S2": "fail", "S5": "fail"}, result.stdout.str()


def test_names_that_are_no_package_are_refused(tmp_path: Path) -> None:
    with pytest.raises(skeleton.SkeletonError, match="lower case"):
        skeleton.write("My-Backend", tmp_path)
    skeleton.write("mine", tmp_path)
    with pytest.raises(skeleton.SkeletonError, match="exists already"):
        skeleton.write("mine", tmp_path)


@pytest.mark.parametrize("runtime", [False, True], ids=["backend", "runtime"])
def test_the_readme_names_the_classes_and_files_the_skeleton_writes(runtime: bool) -> None:
    """Each ``Class.method`` the README says to fill in is defined in the file it names beside it."""
    written = skeleton.runtime_files("mybackend") if runtime else skeleton.files("mybackend")
    to_fill = re.findall(r"`(\w+)\.(\w+)`\s+in\s+`([\w/]+\.py)`", written["README.md"])
    assert len(to_fill) == (1 if runtime else 2), written["README.md"]
    for cls, method, path in to_fill:
        assert path in written, f"the README names {path}, which the skeleton does not write"
        classes = {c.name: c for c in ast.parse(written[path]).body if isinstance(c, ast.ClassDef)}
        assert cls in classes, f"the README names {cls}, which {path} does not define"
        assert method in {f.name for f in classes[cls].body if isinstance(f, ast.FunctionDef)}, (cls, method)


@pytest.mark.parametrize("runtime", [False, True], ids=["backend", "runtime"])
def test_new_backend_help_lists_every_file_it_writes(
    runtime: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["new-backend", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for path in skeleton.runtime_files("NAME") if runtime else skeleton.files("NAME"):
        assert path in shown, f"new-backend --help does not list {path}"


STUB = '        raise NotImplementedError("myrt: fill in load_pte with your runtime")\n'
PROGRAM_PER_METHOD = """\
        from executorch.runtime import Runtime

        class PerMethod:  # each method from a Program of its own: share_mutable_buffers is lost
            def __init__(self) -> None:
                self.methods: dict = {}

            def load_method(self, method: str) -> None:
                if method not in self.methods:
                    loaded = Runtime.get().load_program(program, data_path=data)
                    self.methods[method] = loaded.load_method(method)

            def run(self, method: str, inputs: list) -> list:
                self.load_method(method)
                return self.methods[method].execute(inputs)

        return PerMethod()
"""


def test_a_runtime_skeleton_filled_in_is_judged_and_its_bundle_replays_through_it(tmp_path: Path) -> None:
    """``new-backend --runtime``, its load_pte filled with a wrapper of executorch.runtime that loads each
    method from a Program of its own, installed by pip and run by ``pytest`` in its folder: the shared-state
    lowering catches it by default and names the runtime, the portable lowering's own copies are named the
    lowering's, and a failure's repro bundle replays through the installed runtime, found by its name."""
    assert main(["new-backend", "myrt", "--runtime", "--into", str(tmp_path)]) == 0
    root = tmp_path / "myrt-ptn"
    runtime = root / "myrt_ptn" / "runtime.py"
    text = runtime.read_text()
    assert STUB in text and 'lowerings = ("portable", "shared-state", "external", "xnnpack")' in text
    text = text.replace(STUB, PROGRAM_PER_METHOD)
    runtime.write_text(text.replace('"external", "xnnpack")', ")"))  # the lowerings it supports
    assert not re.search(r"\._[a-z]", text), "the skeleton needs no private name"
    site = tmp_path / "site"
    pip = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
    ]
    installed = subprocess.run(
        [*pip, "--target", str(site), str(root)], capture_output=True, text=True, timeout=240
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    env = {**os.environ, "PYTHONPATH": str(site), "PYTEST_ADDOPTS": "-n 0"}
    command = ["-m", "E3", "-k", "kv_cache and not bf16 and not fp16", "-p", "no:cacheprovider"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *command, "--ptn-report", "out", "--ptn-repro", "bundles"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    rows = json.loads((root / "out" / "results.json").read_text())["results"]
    whose: dict[str, set[str]] = {}
    for r in rows:
        calls = [line for line in r["reason"].splitlines() if line.startswith("  call #")]
        whose.setdefault(r["backend"], set()).update(line.rsplit(": ", 1)[1] for line in calls)
    assert whose == {"myrt@shared-state": {RUNTIME_FAULT}, "myrt@portable": {LOWERING_FAULT}}, rows

    bundle = shutil.copytree(root / "bundles" / "myrt_shared-state-kv_cache", tmp_path / "elsewhere")
    assert json.loads((bundle / repro.MANIFEST).read_text())["backend"] == "myrt@shared-state"
    replay = subprocess.run(
        [sys.executable, repro.REPRO_SCRIPT], cwd=bundle, env=env, capture_output=True, text=True, timeout=240
    )
    assert replay.returncode == 1, replay.stdout + replay.stderr
    calls = [line for line in replay.stdout.splitlines() if line.startswith("  call #")]
    assert calls and all(line.endswith(f"gives eager's values: {RUNTIME_FAULT}") for line in calls), (
        replay.stdout
    )
