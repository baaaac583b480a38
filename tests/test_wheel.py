"""The sdist and the wheel carry the whole plugin: every module, and every file of the conformance suite.

The installed suite reads its known-failure expectations (and points users to its GPU job) from the package,
so a file left out of the wheel turns every known upstream bug into a failure for every user.
"""

import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path, PurePosixPath

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "pytest_ptn"
SUITE_SOURCE = ROOT / "conformance"
SUITE_INSTALLED = PurePosixPath(PACKAGE, "conformance")
BYTECODE = ("__pycache__", "*.py[cod]")


def source_files(folder: Path) -> set[PurePosixPath]:
    """Every file under folder, relative to the repository root, without bytecode."""
    return {
        PurePosixPath(path.relative_to(ROOT).as_posix())
        for path in folder.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and not path.match("*.py[cod]")
    }


def copy_of_source_tree(dest: Path) -> Path:
    """The tree without what git ignores: the build writes egg-info and build/ into its source folder."""
    ignored = [line.strip().rstrip("/") for line in (ROOT / ".gitignore").read_text().splitlines()]
    patterns = [p for p in ignored if p and not p.startswith("#")]
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(".git", *BYTECODE, *patterns))
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sdist, and the wheel built from it, as a release builds them."""
    tmp = tmp_path_factory.mktemp("build")
    source = copy_of_source_tree(tmp / "source")
    out = tmp / "dist"
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return sdist, wheel


def wheel_names(wheel: Path) -> set[PurePosixPath]:
    with zipfile.ZipFile(wheel) as archive:
        return {PurePosixPath(name) for name in archive.namelist()}


def sdist_names(sdist: Path) -> set[PurePosixPath]:
    """Member paths without the archive's top folder (``pytest_ptn-0.1.0/``)."""
    with tarfile.open(sdist) as archive:
        return {PurePosixPath(*PurePosixPath(name).parts[1:]) for name in archive.getnames()}


def test_the_suite_has_data_files() -> None:
    """Guards the checks below: they would pass trivially on a suite of Python modules only."""
    data = {path.name for path in source_files(SUITE_SOURCE) if path.suffix != ".py"}
    assert {"README.md", "nightly.sh"} <= data
    assert any(name.endswith(".toml") for name in data)


def test_wheel_ships_every_file_of_the_suite(built: tuple[Path, Path]) -> None:
    _, wheel = built
    expected = {SUITE_INSTALLED / p.relative_to("conformance") for p in source_files(SUITE_SOURCE)}
    assert expected - wheel_names(wheel) == set()


def test_sdist_ships_every_file_of_the_suite(built: tuple[Path, Path]) -> None:
    sdist, _ = built
    assert source_files(SUITE_SOURCE) - sdist_names(sdist) == set()


def test_wheel_ships_every_module_of_the_package(built: tuple[Path, Path]) -> None:
    """A subpackage missing from pyproject's package list fails here, not on a user's machine."""
    _, wheel = built
    modules = {p for p in source_files(ROOT / PACKAGE) if p.suffix == ".py"}
    assert modules - wheel_names(wheel) == set()


def test_wheel_requires_xdist_at_run_time(built: tuple[Path, Path]) -> None:
    """Crash isolation runs cases in xdist workers, so xdist is no test-only extra."""
    _, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = (n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        headers = Parser().parsestr(archive.read(metadata).decode())
    requirements = [Requirement(line) for line in headers.get_all("Requires-Dist", [])]
    assert any(r.name == "pytest-xdist" and r.marker is None for r in requirements)
