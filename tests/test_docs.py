"""The documentation site's pages drawn from the code (docs/hooks.py): every option, ini setting, command,
flag, fixture and marker a user can type is on them, the hook imports no torch (a docs host installs the
project with --no-deps), and the changelog is there with what is deprecated."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import tomllib

from pytest_ptn import MOVED
from pytest_ptn.cli.main import main
from pytest_ptn.ruleset import RULES, SHOULD

ROOT = Path(__file__).parents[1]
HOOKS = ROOT / "docs" / "hooks.py"
NOT_IN_THE_DOCS_VENV = ("torch", "executorch", "hypothesis", "safetensors", "tomlkit", "xdist", "numpy")
"""What the project depends on that docs/requirements.txt does not install: the hook must not import it."""


@pytest.fixture(scope="module")
def hooks() -> Iterator[ModuleType]:
    """docs/hooks.py, loaded as MkDocs loads it."""
    spec = importlib.util.spec_from_file_location("ptn_docs_hooks", HOOKS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def pytest_run(*args: str, cwd: Path) -> str:
    """What ``pytest ARGS`` prints in ``cwd`` with only installed plugins, none of this project's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_every_page_the_hook_makes_needs_no_torch(tmp_path: Path) -> None:
    """Each placeholder's page part, made in a process where the project's heavy dependencies cannot be
    imported, as on a docs host."""
    script = f"""
import importlib.util, sys
for name in {NOT_IN_THE_DOCS_VENV!r}:
    sys.modules[name] = None  # importing it raises
spec = importlib.util.spec_from_file_location("hooks", {str(HOOKS)!r})
hooks = importlib.util.module_from_spec(spec)
sys.modules["hooks"] = hooks
spec.loader.exec_module(hooks)
for placeholder, made in hooks.PLACEHOLDERS.items():
    assert made(), placeholder
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_option_and_ini_setting_is_on_the_options_page(hooks: ModuleType, tmp_path: Path) -> None:
    """Every ``--ptn-*`` option and ``ptn_*`` ini setting ``pytest --help`` shows has its own heading."""
    shown = pytest_run("--help", cwd=tmp_path)
    options = set(re.findall(r"(?<![\w-])--ptn-[a-z-]*[a-z]", shown))
    ini = set(re.findall(r"^  (ptn_\w+) \(", shown.split("[pytest] configuration options", 1)[1], re.M))
    assert "--ptn-backend" in options and "ptn_timeout" in ini
    page = hooks.options_markdown()
    missing = [o for o in sorted(options) if f"### `{o}` {{#{o[2:]}}}" not in page]
    missing += [i for i in sorted(ini) if f"### `{i}` {{#{i}}}" not in page]
    assert not missing, f"not on the options page: {missing}"


def test_an_option_added_to_the_parser_is_on_the_page_with_its_type_and_default(
    hooks: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin_addoption = hooks.plugin.pytest_addoption

    def more(parser: pytest.Parser) -> None:
        plugin_addoption(parser)
        parser.getgroup("ptn").addoption("--ptn-new", type=int, default=3, help="a new `knob`")
        parser.addini("ptn_new", "the default of --ptn-new", type="string", default="3")

    monkeypatch.setattr(hooks.plugin, "pytest_addoption", more)
    page = hooks.options_markdown()
    assert (
        "### `--ptn-new` {#ptn-new}\n\n`--ptn-new=PTN_NEW`: an integer; default `3`.\n\na new `knob`" in page
    )
    assert "### `ptn_new` {#ptn_new}\n\nType `string`; default `3`." in page


FLAG = r"(?<![\w-])(--?[a-z][\w-]*)"
"""A flag as --help and the page write it: ``-o``, ``--output``."""


def command_helps(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> Iterator[tuple[str, str]]:
    """(command, its --help) for ``python -m pytest_ptn`` and each command under it, found by following
    the commands each --help offers."""
    with pytest.raises(SystemExit):
        main([*path, "--help"])
    shown = capsys.readouterr().out
    yield " ".join(path), shown
    for group in re.findall(r"\{([\w,-]+)\} \.\.\.", shown.split("\n\n", 1)[0]):
        for command in group.split(","):
            yield from command_helps((*path, command), capsys)


def test_every_command_and_its_flags_are_on_the_commands_page(
    hooks: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    page = hooks.commands_markdown()
    sections = {s.split("`", 1)[0]: s for s in re.split(r"^## `", page, flags=re.M)[1:]}
    found = list(command_helps((), capsys))
    assert {"new-backend", "report merge", "expectations update"} <= {command for command, _ in found}
    missing = []
    for command, shown in found:
        flags = set(re.findall(FLAG, shown.split("options:", 1)[1])) - {"-h", "--help"}
        section = sections.get(command or "python -m pytest_ptn")
        if section is None:
            if flags or not re.search(r"\{[\w,-]+\} \.\.\.", shown):
                missing.append(command)  # only a group of commands without flags (report) has none
            continue
        missing += [f"{command} {f}" for f in sorted(flags) if f not in re.findall(FLAG, section)]
    assert not missing, f"not on the commands page: {missing}"


def test_the_markers_and_fixtures_of_the_plugin_are_on_their_page(hooks: ModuleType, tmp_path: Path) -> None:
    markers = hooks.markers_markdown()
    expected = [*RULES, "ptn_scenarios(tag)", "zoo"]
    assert not [m for m in expected if f"| `@pytest.mark.{m}` |" not in markers], markers
    shown = pytest_run("--fixtures", cwd=tmp_path)
    fixtures = re.findall(r"^(ptn_\w+)", shown, re.M)
    assert "ptn_backend" in fixtures
    page = hooks.fixtures_markdown()
    assert not [f for f in fixtures if f"| `{f}` |" not in page], page


def test_getting_started_lists_the_should_rules_of_the_ruleset(hooks: ModuleType) -> None:
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert "SHOULD rules (<!-- ptn:should-rules -->)" in page
    listed = hooks.should_rules().split(", ")
    assert listed == [r.id for r in RULES.values() if r.level == SHOULD] and "A1" in listed


def test_the_docs_build_without_torch_and_formats_signatures() -> None:
    """docs/requirements.txt installs no torch, and has a formatter for mkdocstrings' signatures; the
    project has no docs extra, which would pull torch in with the project's dependencies."""
    requirements = (ROOT / "docs" / "requirements.txt").read_text(encoding="utf-8")
    names = [re.split(r"[\[<>=!~ ]", line, maxsplit=1)[0] for line in requirements.splitlines()]
    names = [n for n in names if n and not n.startswith("#")]
    assert "torch" not in names and {"ruff", "black"} & set(names) and "mkdocs" in names, names
    with (ROOT / "pyproject.toml").open("rb") as f:
        assert "docs" not in tomllib.load(f)["project"]["optional-dependencies"]


def test_the_changelog_is_kept_and_on_the_site(hooks: ModuleType) -> None:
    """Keep a Changelog's shape, this version's section, every moved module under Deprecated, and the
    site's page, footer and URLs."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.M)
    assert versions[0] == ("Unreleased", "") and all(date for _, date in versions[1:]), versions
    assert hooks.version() in [v for v, _ in versions]
    kinds = set(re.findall(r"^### (.+)$", text, re.M))
    assert kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, kinds
    deprecated = text.split("### Deprecated", 1)[1].split("\n## ", 1)[0]
    assert not [
        old for old, new in MOVED.items() if f"`pytest_ptn.{old}` | `pytest_ptn.{new}`" not in deprecated
    ]
    assert (ROOT / "docs" / "changelog.md").read_text(encoding="utf-8").strip() == '--8<-- "CHANGELOG.md"'
    mkdocs = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "- Changelog: changelog.md" in mkdocs
    assert re.search(r"^site_url: https://", mkdocs, re.M) and re.search(r"^repo_url: https://", mkdocs, re.M)
    config = hooks.on_config({"copyright": None})
    assert config["copyright"] == f"pytest-ptn {hooks.version()}, conformance spec v{hooks.SPEC_VERSION}"
