"""Failures grouped by cause: what a failure's text proves decides its group, a symptom joins its case's one
proven cause, and every failed test is in exactly one cause."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pytest_ptn.reporting import cause_views, causes, render, results
from pytest_ptn.reporting.results import FAIL, PASS, XPASS, Result


def row(rule: str, scenario: str, reason: str, outcome: str = FAIL, backend: str = "mine") -> Result:
    nodeid = f"test_{rule}[{backend}-{scenario}]"
    level = "SHOULD" if rule == "S7" else "MUST"
    return Result(rule, level, scenario, backend, outcome, reason, f"pytest '{nodeid}'", None, nodeid)


READ = "Failed: outputs differ from eager:\n  call #1 decode(): value 0 (reads 'w') is 2, eager 1: it read "
READ += "method "
SHARED = "Failed: S2: method 'decode': key 'w' shares storage with method 'prefill''s 'w', other bytes"
CRASH = "crashed: the worker process was killed by SIGSEGV (Segmentation fault) while loading kv on mine"
EARLIER = (
    "Failed: loading kv on mine crashed earlier in this run, not retried: the worker was killed by SIGSEGV "
    "(Segmentation fault) in test_E1[mine-kv]"
)


def test_one_binding_bug_is_one_cause_whatever_rule_shows_it() -> None:
    rows = [
        row("E1", "a", READ + "'prefill''s 'w'"),
        row("S2", "a", SHARED),
        row("S5", "a", "Failed: outputs differ from eager when methods load in reverse order:\n  call #0 x"),
        row("S7", "a", "AssertionError: threads change the sharing topology\nassert {1} == {2}"),
        row("S2", "b", SHARED.replace("'w'", "'v'")),
        row("E1", "c", "Failed: lowering failed: ValueError: constant 'k' of 3 bytes"),
        row("E1", "d", "Failed: lowering failed: ValueError: constant 'j' of 7 bytes"),
        row("E1", "e", CRASH),
        row("E2", "e", EARLIER),
        row("X1", "f", "[XPASS(strict)] known failure of mine on X1: ...", XPASS),
        row("E1", "g", "anything", PASS),
    ]
    found = causes.find_causes(rows)
    kinds = [(c.evidence.kind, len(c.found), c.joined) for c in found]
    assert kinds == [
        (causes.BY_NAME, 5, 2),
        (causes.LOWERING, 2, 0),
        (causes.CRASH, 2, 0),
        (causes.STALE, 1, 0),
    ]
    assert [c.number for c in found] == [1, 2, 3, 4]
    assert found[0].example.result.rule == "E1"
    assert dict(found[0].rules) == {"E1": 1, "S2": 2, "S5": 1, "S7": 1}
    assert found[2].summary == "the worker was killed by SIGSEGV (Segmentation fault) while loading"
    failed = {r.nodeid for r in rows if r.outcome in (FAIL, XPASS)}
    assert sorted(t for c in found for t in c.tests) == sorted(failed)


def test_a_symptom_in_a_case_with_two_proven_causes_stays_apart() -> None:
    rows = [
        row("S2", "a", SHARED),
        row("E1", "a", "Failed: lowering failed: ValueError: no"),
        row("E4", "a", "Failed: outputs differ from eager:\n  call #0 x"),
    ]
    found = causes.find_causes(rows)
    assert sorted(c.evidence.kind for c in found) == sorted([causes.BY_NAME, causes.LOWERING, causes.SYMPTOM])
    symptom = next(c for c in found if c.evidence.kind == causes.SYMPTOM)
    assert symptom.summary == "outputs differ from eager"


def test_reports_lead_with_the_causes(tmp_path: Path) -> None:
    doc = results.Results("1", {}, [row("E1", "a", READ + "'prefill''s 'w'"), row("S2", "a", SHARED)])
    text = render.render_text(doc, pytest_showed=True)
    assert text[0] == "1 cause explains the 2 failing tests, largest first:"
    assert not any("call #1 decode()" in line for line in text), "pytest's section shows the detail"
    render.write_reports(doc, tmp_path)
    [cause] = json.loads((tmp_path / "results.json").read_text())["causes"]
    assert cause["kind"] == causes.BY_NAME and cause["tests"] == ["test_E1[mine-a]", "test_S2[mine-a]"]
    assert cause["reproduce"] == "pytest 'test_E1[mine-a]'"
    md = (tmp_path / "summary.md").read_text()
    assert md.index("### Causes") < md.index("### MUST rules")
    page = (tmp_path / "index.html").read_text()
    assert page.index("<h2>Causes</h2>") < page.index('<table class="matrix">')


def test_sharing_across_names_is_the_wider_cause_of_by_name_reads() -> None:
    """A cache keyed by metadata reads another method's same-named tensor too: one defect, not two."""
    across = SHARED.replace("prefill''s 'w'", "decode''s 'v'")
    rows = [row("E1", "a", READ + "'prefill''s 'w'"), row("S2", "a", SHARED), row("S2", "b", across)]
    [cause] = causes.find_causes(rows)
    assert cause.evidence.kind == causes.SHARES_DIFFERING
    assert cause.summary.endswith("method 'decode''s 'w' is method 'decode''s 'v'")


def test_one_deviation_under_both_schedules_and_two_rules_is_one_cause() -> None:
    """The same wrong value seen by E1 under each load schedule and by E3 is one cause, named by it; another
    value of the case is another."""
    line = "call #1 decode(): value 0 (reads 'kv') is 0.5, eager 0.7"
    up_front = row(
        "E1",
        "kv",
        f"Failed: outputs differ from eager (every method loaded before the first call):\n  {line}",
    )
    late = row(
        "E1", "kv", f"Failed: outputs differ from eager (methods loaded at their first call: a):\n  {line}"
    )
    rows = [
        up_front,
        dataclasses.replace(late, nodeid=late.nodeid.replace("]", "-at_first_call]")),
        row("E3", "kv", f"Failed: outputs reading shared state differ from eager:\n  {line}"),
        row(
            "E1",
            "kv2",
            "Failed: outputs differ from eager:\n  call #0 prefill(): value 0 (reads 'w') is 1, eager 2",
        ),
    ]
    found = causes.find_causes(rows)
    assert [len(c.found) for c in found] == [3, 1]
    assert found[0].summary == "outputs differ from eager at call #1 decode()"


def _explained(call: str, label: str) -> str:
    return f"Failed: outputs differ from eager:\n  {call}: value 0 is 1, eager 2; it equals {label}"


PRIVATE = "what a private copy of '{}' would give (not seeing the other methods' writes)"
ZEROED = "what '{}' starting zero-filled would give"


def test_one_mechanism_is_one_cause_across_scenarios_and_dtypes() -> None:
    """What a faulty-binding replay says a wrong value equals names the mechanism: a private copy of shared
    state in five scenarios (three dtypes) is one cause, as pte without share_mutable_buffers shows it; a
    test showing two mechanisms is the one it shows first; each cause lists its scenarios."""
    rows = [
        row("E1", "kv_cache", _explained("call #2 decode()", PRIVATE.format("shared.kv"))),
        row("E3", "kv_cache", _explained("call #2 decode()", PRIVATE.format("shared.kv"))),
        row("E1", "kv_cache_in_bf16", _explained("call #1 decode()", PRIVATE.format("shared.kv_bf16"))),
        row("E1", "write_only_buffer", _explained("call #2 load()", PRIVATE.format("shared.last"))),
        row(
            "E1",
            "nonpersistent_written",
            _explained("call #1 step()", ZEROED.format("shared.acc"))
            + "\n  "
            + _explained("call #2 peek()", PRIVATE.format("shared.acc")).split("\n  ")[1],
        ),
        row("E5", "nonpersistent_written_in_fp16", _explained("call #0 step()", ZEROED.format("shared.acc"))),
        row(
            "E4",
            "private_same_shape_buffers",
            _explained("call #1 b()", "what buffers 'a_state' and 'b_state' in one memory would give"),
        ),
        row("E1", "colliding", _explained("call #1 decode()", "what method 'prefill''s 'w' would give")),
    ]
    found = causes.find_causes(rows)
    assert [(c.evidence.kind, len(c.found)) for c in found] == [
        (causes.PRIVATE_STATE, 4),
        (causes.ZERO_STATE, 2),
        (causes.BY_NAME, 1),
        (causes.ONE_MEMORY, 1),
    ]
    assert found[0].scenarios == ["kv_cache", "kv_cache_in_bf16", "write_only_buffer"]
    assert "private copy" in found[0].summary and "'shared.kv'" in found[0].summary
    assert "      in kv_cache, kv_cache_in_bf16, write_only_buffer" in cause_views.text_lines(found)
