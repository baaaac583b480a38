"""``python -m pytest_ptn expectations update``: baselines of a new backend and upkeep of its known failures.

One end-to-end test takes a broken reference variant from red to green with one ``update``, then a partial
fix from stale-red back to green with another (two X1 scenarios, rejections only: nothing is run); the rest
check the planning and the file text on hand-made results.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_ptn import expectations
from pytest_ptn.cli import expectations_update
from pytest_ptn.cli.main import main
from pytest_ptn.reporting import reasons, results

TESTS = Path(__file__).resolve().parent
QUIET = ("-p", "no:cacheprovider")
LINK = "https://example.org/bug/7"
TWO_REJECTIONS = ("-m", "X1", "-k", "method_named_state or conflicting_state")


@pytest.fixture
def broken(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.syspath_prepend(str(TESTS))
    pytester.syspathinsert()
    pytester.makeini(f"[pytest]\npythonpath = {TESTS}\n")
    pytester.makepyfile(
        half_fixed="""
        from broken_backends import VagueErrors
        from pytest_ptn.reference import planner

        class HalfFixed(VagueErrors):
            '''broken-x1 after a fix of one rejection: a method named `state` is refused clearly.'''

            def plan(self, methods):
                return planner.plan_package(methods) if "state" in methods else super().plan(methods)
        """
    )
    return pytester


def update(*args: str | Path) -> int:
    return main(["expectations", "update", *map(str, args)])


def test_new_backend_goes_green_then_a_fix_is_stale_until_update(
    broken: pytest.Pytester, warm_torch: None, capsys: pytest.CaptureFixture[str]
) -> None:
    known = broken.path / "broken-x1.toml"
    red = broken.runpytest_inprocess(
        *QUIET, "--ptn-backend=broken_backends:VagueErrors", *TWO_REJECTIONS, "--ptn-report=red"
    )
    assert red.ret == pytest.ExitCode.TESTS_FAILED and red.parseoutcomes().get("failed") == 2

    assert update(broken.path / "red/results.json", "--file", known) == 0
    assert '+scenario = "conflicting_state"' in capsys.readouterr().out
    baseline = expectations.read(known)
    assert {(e.rule, e.scenario, e.link) for e in baseline.entries} == {
        ("X1", "conflicting_state", ""),
        ("X1", "method_named_state", ""),
    }
    assert [e.reason for e in baseline.entries if e.scenario == "method_named_state"] == [
        "ValueError: 'invalid program' does not name ['state']"
    ]
    assert baseline.requires and all(dist in ("torch", "safetensors") for dist in baseline.requires)
    # someone files the conflicting_state bug upstream
    known.write_text(known.read_text().replace('link = ""', f'link = "{LINK}"', 1))

    green = broken.runpytest_inprocess(
        *QUIET, "--ptn-backend=broken_backends:VagueErrors", *TWO_REJECTIONS, f"--ptn-expectations={known}"
    )
    assert green.ret == pytest.ExitCode.OK and green.parseoutcomes().get("xfailed") == 2
    green.stdout.fnmatch_lines(["ptn expectations: 1 of broken-x1.toml without a link (first: X1 *"])

    stale = broken.runpytest_inprocess(
        *QUIET, "--ptn-backend=half_fixed:HalfFixed", *TWO_REJECTIONS, f"--ptn-expectations={known}",
        "--ptn-report=stale",
    )  # fmt: skip
    assert stale.ret == pytest.ExitCode.TESTS_FAILED
    assert stale.parseoutcomes().get("failed") == 1 and stale.parseoutcomes().get("xfailed") == 1
    stale.stdout.fnmatch_lines(["*XPASS(strict)*known failure of broken-x1 on X1*stale*"])

    assert update(broken.path / "stale/results.json", "--file", known) == 0
    out = capsys.readouterr().out
    assert '-scenario = "method_named_state"' in out and "1 kept, 1 stale removed, 0 added" in out
    pruned = expectations.read(known)
    assert [(e.scenario, e.link) for e in pruned.entries] == [("conflicting_state", LINK)]
    assert pruned.requires == baseline.requires

    again = broken.runpytest_inprocess(
        *QUIET, "--ptn-backend=half_fixed:HalfFixed", *TWO_REJECTIONS, f"--ptn-expectations={known}"
    )
    assert again.ret == pytest.ExitCode.OK
    assert again.parseoutcomes().get("xfailed") == 1 and again.parseoutcomes().get("passed") == 1


# --- planning and the file, on hand-made results ------------------------------------------------------


def row(rule: str, scenario: str | None, outcome: str, reason: str = "", test: str = "t") -> results.Result:
    nodeid = f"conformance/test_x.py::{test}[reference-{scenario}]"
    return results.Result(rule, "MUST", scenario, "reference", outcome, reason, "", None, nodeid)


def entry(rule: str, scenario: str, link: str = LINK) -> expectations.Expectation:
    return expectations.Expectation("reference", rule, scenario, f"{rule} breaks", link, Path("x.toml"))


def planned(
    entries: list[expectations.Expectation], rows: list[results.Result]
) -> list[tuple[str, str, str]]:
    _, final = expectations_update.plan(Path("x.toml"), "reference", entries, rows)
    return [(e.rule, e.scenario, e.link) for e, _ in final]


def test_still_failing_entries_stay_passing_ones_go_and_unrun_ones_are_left_alone() -> None:
    entries = [entry("E1", "a"), entry("E1", "b"), entry("S2", "a")]
    rows = [
        row("E1", "a", results.XFAIL),
        row("E1", "b", results.XPASS),
        row("E4", "c", results.FAIL, "boom"),
    ]
    assert planned(entries, rows) == [("E1", "a", LINK), ("S2", "a", LINK), ("E4", "c", "")]


def test_a_run_without_the_file_counts_plain_fails_and_passes() -> None:
    rows = [row("E1", "a", results.FAIL), row("E1", "b", results.PASS)]
    assert planned([entry("E1", "a"), entry("E1", "b")], rows) == [("E1", "a", LINK)]


def test_an_any_scenario_entry_is_narrowed_to_what_still_fails() -> None:
    rows = [row("X1", "a", results.XFAIL), row("X1", "b", results.XPASS), row("X1", "c", results.XFAIL)]
    assert planned([entry("X1", "*")], rows) == [("X1", "a", LINK), ("X1", "c", LINK)]
    assert planned([entry("X1", "*")], [r for r in rows if r.scenario != "b"]) == [("X1", "*", LINK)]


def test_a_failure_under_one_load_schedule_gets_an_entry_for_that_schedule() -> None:
    def at(schedule: str, outcome: str) -> results.Result:
        r = row("E1", "a", outcome, "late load resets the cache", test=f"t-{schedule}")
        return dataclasses.replace(r, schedule=schedule)

    rows = [at("up_front", results.PASS), at("at_first_call", results.FAIL)]
    update, final = expectations_update.plan(Path("x.toml"), "reference", [], rows)
    assert [(e.rule, e.scenario, e.schedule) for e, _ in final] == [("E1", "a", "at_first_call")]
    assert not update.notes
    assert 'schedule = "at_first_call"' in expectations_update.render("", final)
    # an entry for every schedule is narrowed to the one that still fails, reason and link kept
    rows = [at("up_front", results.XPASS), at("at_first_call", results.XFAIL)]
    _, final = expectations_update.plan(Path("x.toml"), "reference", [entry("E1", "a")], rows)
    assert [(e.schedule, e.link) for e, _ in final] == [("at_first_call", LINK)]
    # a scheduled entry stays when the other schedule starts failing too, which gets an entry of its own
    rows = [at("up_front", results.FAIL), at("at_first_call", results.XFAIL)]
    scheduled = dataclasses.replace(entry("E1", "a"), schedule="at_first_call")
    _, final = expectations_update.plan(Path("x.toml"), "reference", [scheduled], rows)
    assert [e.schedule for e, _ in final] == ["at_first_call", None]


def test_a_cell_with_failing_and_passing_tests_is_kept_and_noted() -> None:
    rows = [row("X2", "a", results.XFAIL, test="t1"), row("X2", "a", results.XPASS, test="t2")]
    update, final = expectations_update.plan(Path("x.toml"), "reference", [entry("X2", "a")], rows)
    assert [e.scenario for e, _ in final] == ["a"]
    assert any("X2 a: some tests fail and some pass" in line for line in update.summary())


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        ("AssertionError: ValueError: 'x' does not name ['state']\nassert not ['state']", "ValueError: 'x'"),
        ("assert 1 == 2\n\nE1: decode differs from eager", "E1: decode differs from eager"),
        ("setup: RuntimeError: lowering failed", "setup: RuntimeError: lowering failed"),
        (
            "Failed: outputs differ from eager:\n  call #1 decode(): value 0 (reads 'w') is 2, eager 1\n  #3",
            "outputs differ from eager: call #1 decode(): value 0 (reads 'w') is 2, eager 1",
        ),
    ],
)
def test_the_reason_is_the_first_line_that_says_something(failure: str, reason: str) -> None:
    assert reasons.headline(failure).startswith(reason)


OLD = f"""# measured by hand
backend = "reference"
requires = {{ torch = ">=2.13,<2.14" }}

[[xfail]]
rule = "E1"
scenario = "colliding_literals"
reason = "E1 breaks"
link = "{LINK}"

# the entries below came with the second session

[[xfail]]
rule = "E1"
scenario = "colliding_scalars"
reason = "E1 breaks"
link = "{LINK}"
"""


def test_an_update_keeps_comments_and_range_and_flags_new_links(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text(OLD)
    old = expectations.read(path)
    rows = [
        row("E1", "colliding_literals", results.XPASS),
        row("E1", "colliding_scalars", results.XFAIL),
        row("E3", "cond_constants", results.FAIL, "E3 no"),
    ]
    _, final = expectations_update.plan(path, "reference", old.entries, rows)
    text = expectations_update.render(OLD, final)
    assert text.startswith("# measured by hand\n")
    assert "# the entries below came with the second session" in text
    assert 'requires = { torch = ">=2.13,<2.14" }' in text
    assert f'link = ""  # {expectations_update.LINK_TO_FILL}' in text
    path.write_text(text)
    assert [(e.scenario, e.link) for e in expectations.read(path).entries] == [
        ("colliding_scalars", LINK),
        ("cond_constants", ""),
    ]


def test_a_new_file_takes_the_running_versions() -> None:
    requires = expectations_update.running_requires(["torch", "safetensors"], {"torch": "2.13.0+cpu"})
    assert requires == {"torch": ">=2.13.0,<2.14"}


def test_an_empty_link_is_read_and_counted_but_a_missing_one_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text(
        'backend = "reference"\n[[xfail]]\nrule = "E1"\nscenario = "*"\nreason = "r"\nlink = ""\n'
    )
    known = expectations.read(path)
    assert "(no link yet)" in known.entries[0].describe()
    assert known.summary()[1].startswith("ptn expectations: 1 of x.toml without a link (first: E1 *)")
    path.write_text(path.read_text().replace('link = ""\n', ""))
    with pytest.raises(expectations.ExpectationsError, match="missing link"):
        expectations.read(path)


def test_a_file_of_another_backend_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "results.json"
    results.save(results.Results("1", {"torch": "2.13.0"}, [row("E1", "a", results.FAIL)]), run)
    other = tmp_path / "pte.toml"
    other.write_text('backend = "pte"\n')
    assert update(run, "--file", other) == 2
    assert capsys.readouterr().err.startswith(
        "error: the results hold no backend 'pte' (they hold: reference"
    )


# --- intermittent entries: several runs, timing-dependent rules --------------------------------------------


def intermittent(entries: list[tuple[expectations.Expectation, int | None]]) -> list[tuple[str, str, bool]]:
    return [(e.rule, e.scenario, e.intermittent) for e, _ in entries]


def test_runs_that_disagree_make_an_intermittent_entry_and_s7_is_one_from_one_run() -> None:
    first = [row("E1", "a", results.FAIL), row("E1", "b", results.FAIL), row("S7", "a", results.FAIL)]
    second = [row("E1", "a", results.PASS), row("E1", "b", results.FAIL), row("S7", "a", results.PASS)]
    update, final = expectations_update.plan(Path("x.toml"), "reference", [], first + second)
    assert intermittent(final) == [("E1", "a", True), ("E1", "b", False), ("S7", "a", True)]
    assert not update.notes  # a test that flips is not "some fail and some pass"
    _, final = expectations_update.plan(Path("x.toml"), "reference", [], first)
    assert intermittent(final) == [("E1", "a", False), ("E1", "b", False), ("S7", "a", True)]
    assert "intermittent = true" in expectations_update.render("", final)


def test_an_intermittent_entry_is_never_stale_and_a_strict_one_that_flips_becomes_intermittent() -> None:
    flaky = dataclasses.replace(entry("S7", "a"), intermittent=True)
    passed = [row("S7", "a", results.PASS)]
    update, final = expectations_update.plan(Path("x.toml"), "reference", [flaky], passed)
    assert intermittent(final) == [("S7", "a", True)] and not update.stale
    assert any("S7 a: intermittent, and it passed in every run given" in note for note in update.notes)
    # a strict entry whose test passed in one run and failed in another: kept, link and all, intermittent
    runs = [row("E1", "a", results.XPASS), row("E1", "a", results.XFAIL)]
    update, final = expectations_update.plan(Path("x.toml"), "reference", [entry("E1", "a")], runs)
    assert [(e.intermittent, e.link, index) for e, index in final] == [(True, LINK, 0)]
    assert "1 kept, 1 made intermittent, 0 stale removed, 0 added" in update.summary()[0]
    # an "*" entry is narrowed: the scenario that flips intermittent, the one that always fails strict
    runs = [row("X1", "a", results.XFAIL), row("X1", "b", results.XFAIL), row("X1", "b", results.XPASS)]
    _, final = expectations_update.plan(Path("x.toml"), "reference", [entry("X1", "*")], runs)
    assert intermittent(final) == [("X1", "a", False), ("X1", "b", True)]


def test_an_entry_made_intermittent_keeps_its_comments_in_place(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text(OLD)
    old = expectations.read(path)
    runs = [row("E1", "colliding_literals", results.XFAIL), row("E1", "colliding_literals", results.XPASS)]
    runs += [row("E1", "colliding_scalars", results.XFAIL)]
    _, final = expectations_update.plan(path, "reference", old.entries, runs)
    path.write_text(expectations_update.render(OLD, final))
    text = path.read_text()
    first = text.index('scenario = "colliding_literals"')
    assert first < text.index("intermittent = true") < text.index("# the entries below came with the second")
    assert [(e.scenario, e.intermittent, e.link) for e in expectations.read(path).entries] == [
        ("colliding_literals", True, LINK),
        ("colliding_scalars", False, LINK),
    ]


def test_update_reads_several_results_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = []
    for i, outcome in enumerate((results.FAIL, results.PASS, results.FAIL)):
        runs.append(tmp_path / f"run{i}.json")
        results.save(results.Results("1", {"torch": "2.13.0"}, [row("E1", "a", outcome)]), runs[-1])
    known = tmp_path / "known.toml"
    assert update(*runs, "--file", known) == 0
    assert "1 added (1 intermittent)" in capsys.readouterr().out
    (e,) = expectations.read(known, ["a"]).entries
    assert (e.rule, e.scenario, e.intermittent) == ("E1", "a", True)
    assert "intermittent failure" in e.describe() and "stale" not in e.describe()


def test_intermittent_must_be_true_or_false(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text(
        'backend = "reference"\n[[xfail]]\nrule = "S7"\nscenario = "*"\nreason = "r"\nlink = ""\n'
        'intermittent = "sometimes"\n'
    )
    with pytest.raises(expectations.ExpectationsError, match="intermittent must be true or false"):
        expectations.read(path)
