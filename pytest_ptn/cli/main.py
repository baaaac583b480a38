"""Command line outside a pytest run: what is installed, and work on result files (combining CI's jobs).

python -m pytest_ptn --version
python -m pytest_ptn list {backends,scenarios,rules} [--json]
python -m pytest_ptn report merge A.json B.json ... -o OUTDIR [--previous OLD.json]
python -m pytest_ptn report render DIR [-o OUTDIR]
python -m pytest_ptn expectations update RESULTS.json [RESULTS.json ...] [--file EXPECTATIONS.toml]
python -m pytest_ptn new-backend NAME [--runtime] [--into DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_ptn import DISTRIBUTION, __version__, expectations
from pytest_ptn.backend import BackendError
from pytest_ptn.cli import expectations_update, inventory, progress, skeleton
from pytest_ptn.reporting import matrix, render, results, stream
from pytest_ptn.ruleset import SPEC_VERSION


def _all_backends() -> list[inventory.BackendInfo]:
    """What ``list backends`` lists, saying on stderr what it is doing and holding back what upstream prints
    meanwhile (pytest_ptn.cli.progress): stdout is the table's, or the JSON's, alone."""
    with progress.held() as status:
        return inventory.all_backends(status)


LISTINGS: dict[str, tuple[Callable[[], list[Any]], Callable[[list[Any]], list[str]]]] = {
    "backends": (_all_backends, inventory.render_backends),
    "scenarios": (inventory.scenarios, inventory.render_scenarios),
    "rules": (inventory.rules, inventory.render_rules),
}
"""What ``list`` can show: how to gather it, how to print it as text."""


def build_parser() -> argparse.ArgumentParser:
    """Every command and its flags: the documentation site draws its commands page from it (docs/hooks.py)."""
    parser = argparse.ArgumentParser(prog="python -m pytest_ptn", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--version",
        action="version",
        version=f"{DISTRIBUTION} {__version__} (conformance spec v{SPEC_VERSION})",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser(
        "list",
        help="what is installed and known: backends, scenarios or rules",
        description="backends: availability, versions, capabilities and the rules each can show; "
        "scenarios: the catalogue with tags; rules: level, title and the capabilities each needs.",
    )
    listing.add_argument("what", choices=sorted(LISTINGS))
    listing.add_argument("--json", action="store_true", help="one JSON array, for machines")
    listing.set_defaults(run=_list)
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
    rendering = report_commands.add_parser(
        "render",
        help=f"write results.json, summary.md, index.html from the {stream.NAME} a run left in DIR",
        description=f"Every test a run finished is in DIR/{stream.NAME} as soon as it finishes, so a run "
        "that was killed (SIGKILL, out of memory) before writing its reports still has them: this renders "
        "them, marked incomplete unless the run ended normally.",
    )
    rendering.add_argument("dir", type=Path, metavar="DIR", help="the --ptn-report folder of the run")
    rendering.add_argument(
        "-o", "--output", type=Path, metavar="OUTDIR", help="where to write (default: DIR)"
    )
    rendering.set_defaults(run=_render)
    known = commands.add_parser("expectations", help="known-failure files (--ptn-expectations)")
    known_commands = known.add_subparsers(dest="expectations_command", required=True)
    update = known_commands.add_parser(
        "update",
        help="write or update a backend's known failures from the results.json of one run or several",
        description="Entries of rule x scenario that still fail are kept with their reason and link, those "
        "that passed (xpass: stale) are removed, new failures are added with an empty link to fill in; "
        "the diff is printed. A test that failed in one of the runs given and passed in another makes its "
        "entry intermittent (it may pass or fail, never stale), as does any S7 failure (its verdict is "
        "thread timing). A new file takes the run's versions; an existing one keeps its range.",
    )
    update.add_argument("results", type=Path, nargs="+", metavar="RESULTS_JSON")
    update.add_argument(
        "--file",
        type=Path,
        metavar="TOML",
        help="the expectations file to update or create (default: <backend>.toml here, for each backend run)",
    )
    update.set_defaults(run=_update_expectations)
    new_backend = commands.add_parser(
        "new-backend",
        help="write a backend package to fill in: entry point, Backend subclass, tests",
        description=f"Writes NAME-ptn/ ({skeleton.listing(runtime=False)}): the reference backend under the "
        "name NAME, green on the suite, with the lowering (backend.py) and the loader's binding (loader.py) "
        f"to replace with your own. With --runtime ({skeleton.listing(runtime=True)}): a runtime of .pte "
        "files (PteRuntime), run on executorch's lowerings, with load_pte to fill in.",
    )
    new_backend.add_argument(
        "name", metavar="NAME", help="the backend's name: lower case letters, digits and _ (package NAME_ptn)"
    )
    new_backend.add_argument(
        "--runtime",
        action="store_true",
        help="a runtime of .pte files: executorch lowers, your runtime loads and runs the .pte",
    )
    new_backend.add_argument(
        "--into", type=Path, default=Path("."), metavar="DIR", help="the folder to write it in"
    )
    new_backend.set_defaults(run=_new_backend)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as shell tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (
        OSError,
        results.ResultsFormatError,
        expectations.ExpectationsError,
        BackendError,
        skeleton.SkeletonError,
    ) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _list(args: argparse.Namespace) -> int:
    gather, render = LISTINGS[args.what]
    infos = gather()
    if args.json:
        print(json.dumps([dataclasses.asdict(info) for info in infos], indent=2))
    else:
        print("\n".join(render(infos)))
    return 0


def _merge(args: argparse.Namespace) -> int:
    merged = results.merge([results.load(path) for path in args.inputs])
    changes = matrix.diff(results.load(args.previous), merged) if args.previous else None
    written = render.write_reports(merged, args.output, changes)
    print("\n".join(render.render_text(merged)))
    if changes is not None:
        print(f"\nchanges since {args.previous}:")
        print("\n".join(render.render_changes_text(changes)))
    print()
    print("\n".join(f"wrote {path}" for path in written))
    return 0


def _render(args: argparse.Namespace) -> int:
    doc = stream.read(args.dir / stream.NAME)
    written = render.write_reports(doc, args.output or args.dir)
    print("\n".join(render.render_text(doc)))
    print()
    print("\n".join(f"wrote {path}" for path in written))
    return 0


def _update_expectations(args: argparse.Namespace) -> int:
    docs = [results.load(path) for path in args.results]
    updates = expectations_update.update(docs, args.file, Path.cwd())
    for update in updates:
        print("\n".join(update.diff()))
        update.path.write_text(update.new_text, encoding="utf-8")
        print("\n".join(update.summary()))
    if not updates:
        given = " ".join(map(str, args.results))
        print(f"{given} {'holds' if len(docs) == 1 else 'hold'} no conformance results: nothing to write")
    return 0


def _new_backend(args: argparse.Namespace) -> int:
    written = skeleton.write(args.name, args.into, args.runtime)
    print("\n".join(f"wrote {path}" for path in written))
    root = written[0].parent
    if args.runtime:
        print(f"fill in load_pte in {root / f'{args.name}_ptn' / 'runtime.py'}")
        print(f"the entry point, in {root / 'pyproject.toml'} (or your own package's):")
        print(skeleton.entry_point(args.name, runtime=True))
    print(f"next: cd {root} && pip install -e . && pytest")
    return 0
