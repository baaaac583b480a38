"""The two commands README.md gives a newcomer are the ones CI runs, word for word: a README edited to a
command CI does not run fails here, and so fails CI."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]


def readme_commands() -> list[str]:
    """The fenced commands of README's "Set up and run" section, in order."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("\n## Set up and run\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"^```\n(.*?)^```$", section, re.M | re.S)]


def ci_commands() -> dict[str, str]:
    """.ci/run's ``readme_<name>="..."`` lines: name -> command."""
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    return dict(re.findall(r'^readme_(\w+)="([^"$`\\]*)"$', text, re.M))


def test_ci_runs_the_readme_commands_as_written() -> None:
    ci = ci_commands()
    assert readme_commands() == [ci["suite"], ci["tests"]] == list(ci.values())


def test_ci_runs_each_of_them() -> None:
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for name in ci_commands():
        assert f'\nstep bash -c "$readme_{name}"\n' in text, name


def test_ci_builds_the_docs_as_the_readme_says() -> None:
    """README's "Documentation" command is .ci/run's docs build and development.md's, word for word: no
    torch, --strict."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("\n## Documentation\n", 1)[1]
    readme = [block.strip() for block in re.findall(r"^```\n(.*?)^```$", section, re.M | re.S)]
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    ci = re.findall(r'^docs_build="([^"$`\\]*)"$', text, re.M)
    assert readme == ci and "--no-deps" in ci[0] and ci[0].endswith("mkdocs build --strict"), (readme, ci)
    assert '\nstep bash -c "$docs_build"\n' in text
    assert f"```\n{ci[0]}\n```" in (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
