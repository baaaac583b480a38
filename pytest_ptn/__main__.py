"""Command line for work on result files outside a pytest run, e.g. combining the per-backend jobs of CI.

python -m pytest_ptn report merge A.json B.json ... -o OUTDIR [--previous OLD.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_ptn import matrix


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_ptn", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser("report", help="work with results.json files written by --ptn-report")
    report_commands = report.add_subparsers(dest="report_command", required=True)
    merge = report_commands.add_parser(
        "merge",
        help="merge results into one matrix and write results.json, summary.md, index.html",
        description="Merge results files; a test/rule/backend present in several keeps the last file's row.",
    )
    merge.add_argument("inputs", nargs="+", type=Path, metavar="RESULTS_JSON")
    merge.add_argument("-o", "--output", required=True, type=Path, metavar="OUTDIR")
    merge.add_argument(
        "--previous",
        type=Path,
        metavar="OLD_JSON",
        help="an earlier merged results.json: list the cells whose status changed, newly failing first",
    )
    merge.set_defaults(run=_merge)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except (OSError, matrix.ResultsFormatError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _merge(args: argparse.Namespace) -> int:
    merged = matrix.merge([matrix.load(path) for path in args.inputs])
    changes = matrix.diff(matrix.load(args.previous), merged) if args.previous else None
    written = matrix.write_reports(merged, args.output, changes)
    print("\n".join(matrix.render_text(merged)))
    if changes is not None:
        print(f"\nchanges since {args.previous}:")
        print("\n".join(matrix.render_changes_text(changes)))
    print()
    print("\n".join(f"wrote {path}" for path in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
