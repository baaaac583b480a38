"""CI's skips, from the JUnit XML files its pytest runs write: every skip printed with its reason, grouped,
and an exit status of 1 while one is neither run elsewhere nor allowed.

A test that skipped in one run and passed in another ran in CI (the README's tests skip what needs an extra;
a later run with it installed passes them): it is listed, with where it ran. Any other skip must match an
entry of the allow-list (.ci/allowed-skips.toml: a reason CI cannot avoid, with a line on why), or it fails.
The conformance runs' skips are not judged here (the allow-list's header says why).

Standard library only: it runs with any Python 3.11, before or without a venv.
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import tomllib

ALLOWED = Path(__file__).with_name("allowed-skips.toml")


@dataclass(frozen=True)
class Allowed:
    """One entry of the allow-list: a skip whose reason (and test, where given) match, and why it stays."""

    reason: str
    why: str
    test: str = ""

    def matches(self, test: str, reason: str) -> bool:
        return bool(re.search(self.reason, reason)) and bool(re.search(self.test, test))


def load_allowed(path: Path) -> list[Allowed]:
    with path.open("rb") as f:
        entries = tomllib.load(f).get("skip", [])
    allowed = [Allowed(**entry) for entry in entries]
    for entry in allowed:
        if not entry.why.strip():
            raise SystemExit(f"{path}: the entry for {entry.reason!r} does not say why it cannot be avoided")
    return allowed


def outcomes(report: Path) -> tuple[dict[str, str], set[str]]:
    """A JUnit XML file's skips (test id -> reason) and the tests that passed. xfails are not skips: pytest
    writes them as <skipped type="pytest.xfail">."""
    skipped: dict[str, str] = {}
    passed: set[str] = set()
    for case in ET.parse(report).getroot().iter("testcase"):
        test = "::".join(part for part in (case.get("classname", ""), case.get("name", "")) if part)
        results = [child for child in case if child.tag in ("skipped", "failure", "error")]
        if not results:
            passed.add(test)
        for result in results:
            if result.tag == "skipped" and result.get("type") != "pytest.xfail":
                skipped[test] = result.get("message", "")
    return skipped, passed


def check(reports: list[Path], allowed: list[Allowed]) -> bool:
    """Prints every skip of ``reports`` grouped by reason; whether each ran elsewhere or is allowed."""
    ran: dict[str, list[str]] = defaultdict(list)
    skips: dict[Path, dict[str, str]] = {}
    for report in reports:
        skips[report], passed = outcomes(report)
        for test in passed:
            ran[test].append(report.name)
    # reason -> (verdict, tests with the reports they skipped in)
    groups: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    unused = list(allowed)
    ok = True
    for report, skipped in skips.items():
        for test, reason in skipped.items():
            elsewhere = [name for name in ran.get(test, []) if name != report.name]
            entry = next((a for a in allowed if a.matches(test, reason)), None)
            if elsewhere:
                verdict = f"ran elsewhere ({', '.join(sorted(set(elsewhere)))})"
            elif entry is not None:
                verdict = f"allowed: {entry.why}"
                if entry in unused:
                    unused.remove(entry)
            else:
                verdict = "NOT ALLOWED: add what it needs to .ci/run, or list it in .ci/allowed-skips.toml"
                ok = False
            groups[f"{reason}\n    -> {verdict}"][test].append(report.name)
    total = sum(len(s) for s in skips.values())
    print(f"skips: {total} in {', '.join(f'{r.name} ({len(s)})' for r, s in skips.items())}")
    for key in sorted(groups, key=lambda k: "NOT ALLOWED" in k):  # last, where a log's tail shows them
        tests = groups[key]
        print(f"  {len(tests)} x {key}")
        for test in sorted(tests):
            print(f"      {test} ({', '.join(tests[test])})")
    for entry in unused:
        print(f"  (allowed, not seen in this run: {entry.reason!r})")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path, help="JUnit XML files of CI's runs of tests/")
    parser.add_argument("--allowed", type=Path, default=ALLOWED)
    args = parser.parse_args(argv)
    missing = [str(report) for report in args.reports if not report.is_file()]
    if missing:  # a run that wrote none ended before its tests: its skips are unknown
        print(f"skips: no report {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0 if check(args.reports, load_allowed(args.allowed)) else 1


if __name__ == "__main__":
    sys.exit(main())
