"""MkDocs hook: what the site says about the code is drawn from the code when the site is built, so it cannot
drift: the rules tables (pytest_ptn.ruleset and the conformance tests' markers), the SHOULD rules, every
pytest option and ini setting (the plugin's parser), every ``python -m pytest_ptn`` command (its argparse
parser), the fixtures and markers, and the version. It imports pytest_ptn, never torch: a docs host installs
the project with --no-deps (docs/requirements.txt), and tests/test_docs.py imports this with torch blocked."""

from __future__ import annotations

import argparse
import ast
import functools
import html
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from pytest_ptn import plugin
from pytest_ptn.cli import main as cli
from pytest_ptn.ruleset import (
    RULE_CONDITIONS,
    RULE_NEEDS,
    RULES,
    SHOULD,
    SPEC_VERSION,
    TIMING_DEPENDENT,
)

ROOT = Path(__file__).parents[1]
SUITE = ROOT / "conformance"
FAMILIES = {
    "P": "Packaging",
    "E": "Execution",
    "S": "Loader sharing",
    "X": "Errors",
    "A": "Accuracy",
}


def version() -> str:
    """The version pyproject.toml gives, its one source, whether or not this checkout is installed."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def rule_tests() -> dict[str, list[tuple[str, str, str]]]:
    """Rule id -> (test file, test function, the scenario tags it runs on) of every conformance test that
    carries the rule's marker."""
    found: dict[str, list[tuple[str, str, str]]] = {rule: [] for rule in RULES}
    for path in sorted(SUITE.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module_tags = ""
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
            ):
                module_tags = scenario_tags([node.value])
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            tags = scenario_tags(node.decorator_list) or module_tags
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Attribute) and decorator.attr in RULES:
                    found[decorator.attr].append((path.name, node.name, tags))
    return found


def scenario_tags(decorators: list[ast.expr]) -> str:
    """The tags of a ``pytest.mark.ptn_scenarios(...)`` among ``decorators``, or ""."""
    for decorator in decorators:
        if (
            isinstance(decorator, ast.Call)
            and isinstance(decorator.func, ast.Attribute)
            and decorator.func.attr == "ptn_scenarios"
        ):
            return ", ".join(f"`{arg.value}`" for arg in decorator.args if isinstance(arg, ast.Constant))
    return ""


def rules_markdown() -> str:
    """One table per family: each rule's level, the capabilities it needs and the tests that check it."""
    tests = rule_tests()
    lines = [f"Conformance spec version {SPEC_VERSION}.", ""]
    for family, title in FAMILIES.items():
        lines += [
            f"### {title} ({family})",
            "",
            "| rule | title | level | a backend must show | checked by (conformance/) | on scenarios |",
            "|---|---|---|---|---|---|",
        ]
        for rule in (r for r in RULES.values() if r.family == family):
            needs = ", ".join(sorted(c.value for c in RULE_NEEDS[rule.id])) or "nothing"
            if rule.id in RULE_CONDITIONS:
                capability, condition = RULE_CONDITIONS[rule.id]
                needs += f"; without `{capability.value}`, {condition}"
            if rule.id in TIMING_DEPENDENT:
                needs += "; its verdict depends on thread timing (listed as intermittent)"
            checked = "<br>".join(f"`{file}::{name}`" for file, name, _ in tests[rule.id]) or "-"
            tags = "<br>".join(tag or "its own programs" for _, _, tag in tests[rule.id]) or "-"
            lines.append(f"| {rule.id} | {rule.title} | {rule.level} | {needs} | {checked} | {tags} |")
        lines.append("")
    return "\n".join(lines)


def should_rules() -> str:
    """The SHOULD rules, in the ruleset's order: "P9, P10, S7, A1"."""
    return ", ".join(rule.id for rule in RULES.values() if rule.level == SHOULD)


def prose(text: str) -> str:
    """Help text as Markdown: its `code` kept, and outside it nothing read as markup (``<backend>.toml``,
    ``$GITHUB_STEP_SUMMARY``, a ``|`` inside a table)."""
    parts = text.replace("``", "`").split("`")  # a docstring's ``code`` is Markdown's `code`
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"([\\*_\[\]|])", r"\\\1", html.escape(parts[i], quote=False))
    return "`".join(parts)


@dataclass(frozen=True)
class Ini:
    """An ini setting as the plugin adds it."""

    name: str
    help: str
    type: str
    default: Any


class ParserRecorder:
    """Stands in for pytest's parser while the plugin adds its options: each option becomes an argparse
    action (its type, default and choices as argparse reads them), each ini setting an Ini."""

    def __init__(self) -> None:
        self.options = argparse.ArgumentParser(add_help=False)
        self.ini: list[Ini] = []

    def getgroup(self, name: str, description: str = "", after: str | None = None) -> ParserRecorder:
        return self

    def addoption(self, *names: str, **attrs: Any) -> None:
        self.options.add_argument(*names, **attrs)

    def addini(self, name: str, help: str, type: str | None = None, default: Any = None) -> None:
        self.ini.append(Ini(name, help, type or "string", default))


def plugin_parser() -> ParserRecorder:
    """What ``pytest_ptn.plugin.pytest_addoption`` adds to pytest."""
    recorder = ParserRecorder()
    plugin.pytest_addoption(recorder)  # duck-typed: the plugin calls getgroup, addoption and addini
    return recorder


def invocation(action: argparse.Action) -> str:
    """How an argument is written: ``--ptn-seed=N``, ``--ptn-zoo``, ``RESULTS_JSON``."""
    metavar = action.metavar or ("|".join(action.choices) if action.choices else None)
    if not action.option_strings:
        return str(metavar or action.dest)
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    value = metavar or action.dest.upper()
    return ", ".join(f"{o}={value}" if o.startswith("--") else f"{o} {value}" for o in action.option_strings)


def facts(action: argparse.Action) -> str:
    """What value an argument takes, and what it is when not given."""
    kinds = {int: "an integer", float: "a number", Path: "a path"}
    if action.nargs == 0:
        what = "a flag"
    elif action.choices:
        what = "one of " + ", ".join(f"`{choice}`" for choice in action.choices)
    else:
        what = kinds.get(action.type, "a string")
    if isinstance(action, argparse._AppendAction) or action.nargs == "+":
        what += ", one or more" if action.nargs == "+" else ", repeatable"
    if action.required or (not action.option_strings and action.nargs != "?"):
        return f"{what}; required"
    if action.nargs == 0:
        return f"{what}; off unless given"
    default = "none" if action.default is None else f"`{action.default}`"
    return f"{what}; default {default}"


def anchor(name: str) -> str:
    """A heading's id from an option's or ini setting's name: ``--ptn-timeout`` -> ``ptn-timeout``, and
    ``ptn_timeout`` stays ``ptn_timeout``."""
    return name.lstrip("-")


def options_markdown() -> str:
    """Every command-line option the plugin adds, then every ini setting: each with its type, default and
    help, as its parser has them."""
    recorder = plugin_parser()
    lines = ["## Command-line options", ""]
    for action in recorder.options._actions:
        name = action.option_strings[-1]
        lines += [
            f"### `{name}` {{#{anchor(name)}}}",
            "",
            f"`{invocation(action)}`: {facts(action)}.",
            "",
            prose(action.help or ""),
            "",
        ]
    lines += ["## Ini settings", ""]
    for ini in recorder.ini:
        default = "none" if ini.default is None else f"`{ini.default}`"
        lines += [
            f"### `{ini.name}` {{#{anchor(ini.name)}}}",
            "",
            f"Type `{ini.type}`; default {default}.",
            "",
            prose(ini.help),
            "",
        ]
    return "\n".join(lines)


def commands(parser: argparse.ArgumentParser) -> list[tuple[argparse.ArgumentParser, str]]:
    """Every command under ``parser`` that runs something (``report merge``, not ``report``), with the help
    line its parent gives it."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                below = commands(sub)
                found += below or [(sub, helps[name])]
    return found


def arguments_markdown(parser: argparse.ArgumentParser) -> list[str]:
    """One line per argument of ``parser`` (not -h, not a choice of command)."""
    lines = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if isinstance(action, argparse._VersionAction):
            lines.append(f"- `{invocation(action)}`: {prose(action.help or '')}")
            continue
        said = f": {prose(action.help)}" if action.help else ""
        lines.append(f"- `{invocation(action)}` ({facts(action)}){said}")
    return lines


def commands_markdown() -> str:
    """``python -m pytest_ptn`` itself, then each of its commands: its usage, what it does and every flag,
    as its argparse parser has them."""
    top = cli.build_parser()
    lines = [f"## `{top.prog}`", "", "```", usage(top), "```", "", prose(top.description or ""), ""]
    lines += [*arguments_markdown(top), ""]
    for command, summary in commands(top):
        name = command.prog.removeprefix(f"{top.prog} ")
        lines += [f"## `{name}` {{#{name.replace(' ', '-')}}}", "", "```", usage(command), "```", ""]
        lines += [prose(summary) + ".", ""]
        if command.description:
            lines += [prose(command.description), ""]
        lines += [*arguments_markdown(command), ""]
    return "\n".join(lines)


def usage(parser: argparse.ArgumentParser) -> str:
    """The usage line, wrapped at 100 columns whatever the terminal building the site."""
    parser.formatter_class = functools.partial(argparse.HelpFormatter, width=100)
    return parser.format_usage().strip()


def fixtures_markdown() -> str:
    """The plugin's fixtures, read from its source (a fixture's object is pytest's wrapper): each one's
    name, scope, what it gives and its docstring."""
    tree = ast.parse(Path(plugin.__file__).read_text(encoding="utf-8"))
    lines = ["| fixture | scope | gives | what it is |", "|---|---|---|---|"]
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            target = call.func if call else decorator
            if not (isinstance(target, ast.Attribute) and target.attr == "fixture"):
                continue
            scopes = [k.value for k in call.keywords if k.arg == "scope"] if call else []
            scope = ast.literal_eval(scopes[0]) if scopes else "function"
            gives = ast.unparse(node.returns) if node.returns else ""
            doc = " ".join((ast.get_docstring(node) or "").split())
            lines.append(f"| `{node.name}` | {scope} | `{gives}` | {prose(doc)} |")
    return "\n".join(lines)


def pytest_markers(*args: str) -> dict[str, str]:
    """``pytest --markers``, run with ``args`` in an empty folder with no plugin autoloaded: marker -> its
    line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    with tempfile.TemporaryDirectory() as empty:
        shown = subprocess.run(
            [sys.executable, "-m", "pytest", "--markers", "-p", "no:cacheprovider", *args],
            cwd=empty,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    found = re.findall(r"^@pytest\.mark\.(\w+)(.*)$", shown, re.M)
    return {name: f"{name}{rest}" for name, rest in found}


def markers_markdown() -> str:
    """The markers the plugin registers, as ``pytest --markers`` shows them: those it shows with the plugin
    loaded and not without it."""
    builtin = pytest_markers()
    lines = ["| marker | what it marks |", "|---|---|"]
    for name, line in pytest_markers("-p", plugin.__name__).items():
        if name not in builtin:
            signature, _, what = line.partition(": ")
            lines.append(f"| `@pytest.mark.{signature}` | {prose(what)} |")
    return "\n".join(lines)


def version_markdown() -> str:
    return f"pytest-ptn {version()}, conformance spec v{SPEC_VERSION}"


PLACEHOLDERS: dict[str, Callable[[], str]] = {
    "<!-- ptn:rules -->": rules_markdown,
    "<!-- ptn:should-rules -->": should_rules,
    "<!-- ptn:options -->": options_markdown,
    "<!-- ptn:commands -->": commands_markdown,
    "<!-- ptn:fixtures -->": fixtures_markdown,
    "<!-- ptn:markers -->": markers_markdown,
    "<!-- ptn:version -->": version_markdown,
    "<!-- ptn:default-backend -->": lambda: f"`{plugin.DEFAULT_BACKEND}`",
}
"""What each placeholder of a page becomes, built when the site is."""


def on_config(config: Any) -> Any:
    """MkDocs' hook: every page's footer names the version the site documents."""
    config["copyright"] = version_markdown()
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs' hook: each placeholder of a page becomes what it stands for."""
    for placeholder, made in PLACEHOLDERS.items():
        if placeholder in markdown:
            markdown = markdown.replace(placeholder, made())
    return markdown
