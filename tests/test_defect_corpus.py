"""Every member of the defect corpus (tests/defect_corpus.py) is caught by the selection CI runs for it, and
the failure names a mechanism of the member's kind: a change that blinds the suite to a real defect, or
files it under the wrong mechanism, fails here (issue 57). benchmarks/detection.py measures every mode."""

from __future__ import annotations

import json

import pytest
from broken_backends import PROCESS_WIDE
from defect_corpus import CORPUS, Defect

from pytest_ptn import mechanisms
from pytest_ptn.plugin import suite_path


def _param(defect: Defect) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=defect.pending)] if defect.pending else []
    return pytest.param(defect, id=defect.backend.__name__, marks=marks)


def test_corpus_holds_twelve_defects_each_with_its_kinds_and_selection() -> None:
    assert len({d.backend for d in CORPUS}) == len(CORPUS) >= 12
    for d in CORPUS:
        assert d.name and d.origin and d.kinds, d
        assert all(isinstance(k, mechanisms.Kind) for k in d.kinds), d
        assert (suite_path() / d.ci[0]).is_file(), d


@pytest.mark.parametrize("defect", [_param(d) for d in CORPUS])
def test_ci_catches_defect_by_its_mechanism(
    defect: Defect, pytester: pytest.Pytester, warm_torch: None
) -> None:
    PROCESS_WIDE.clear()  # a fresh process's: what an earlier test of this one left is no program's here
    result = pytester.runpytest_inprocess(
        *defect.ci_args(suite_path()), defect.option, "--ptn-no-expectations", "-p", "no:cacheprovider"
    )
    failed = [r for r in result.reprec.getfailures() if r.when == "call"]  # type: ignore[attr-defined]
    assert failed, f"{defect.name}: {defect.ci} passed: {result.parseoutcomes()}"
    found = {
        m
        for r in failed
        for m in mechanisms.from_data(json.loads(dict(r.user_properties).get(mechanisms.PROPERTY, "[]")))
    }
    assert {m.kind for m in found} & defect.kinds, (
        f"{defect.name} failed {len(failed)} tests, none with a mechanism of kind "
        f"{'/'.join(sorted(defect.kinds))}: {sorted(m.key for m in found)}"
    )
