"""``python -m pytest_ptn new-backend``: a package an author fills in with public hooks only, and the suite
then judges what they wrote."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_ptn.cli import skeleton
from pytest_ptn.cli.main import main
from pytest_ptn.plugin import suite_path

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
