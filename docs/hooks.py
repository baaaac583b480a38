"""MkDocs hook: the rules page's tables come from pytest_ptn.ruleset and the conformance tests' markers, so
the page cannot drift from the rules the suite checks."""

from __future__ import annotations

import ast
from pathlib import Path

from pytest_ptn.ruleset import RULE_CONDITIONS, RULE_NEEDS, RULES, SPEC_VERSION, TIMING_DEPENDENT

SUITE = Path(__file__).parents[1] / "conformance"
PLACEHOLDER = "<!-- ptn:rules -->"
FAMILIES = {
    "P": "Packaging",
    "E": "Execution",
    "S": "Loader sharing",
    "X": "Errors",
    "A": "Accuracy",
}


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


def on_page_markdown(markdown: str, page, config, files) -> str:
    """MkDocs' hook: the placeholder of docs/rules.md becomes the tables, built when the site is."""
    if PLACEHOLDER not in markdown:
        return markdown
    return markdown.replace(PLACEHOLDER, rules_markdown())
