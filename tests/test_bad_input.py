"""Every bad input stops the run at configure time with one line naming it (issue 13).

A mistyped ``--ptn-backend``, a backend module that cannot be imported, an unfinished Backend subclass, a
broken ``availability()`` or a malformed ``--ptn-expectations`` file is the user's input, not a defect of
the plugin: pytest's usage error (exit 4, one ``ERROR:`` line) instead of a traceback. Called directly,
``resolve_backend``, ``availability_of`` and ``expectations.read`` raise their documented error types.
None of this imports torch: resolution happens in pytest_configure, before anything is lowered.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pytest_ptn import expectations
from pytest_ptn.backend import BackendError, availability_of, resolve_backend

QUIET = ("-p", "no:cacheprovider")


def usage_error(result: pytest.RunResult) -> str:
    """The run's one complaint: exit 4 and a single line on stderr, no traceback."""
    output = "\n".join(result.outlines + result.errlines)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output
    lines = [line for line in result.errlines if line.strip()]
    assert len(lines) == 1, output
    return lines[0]


# --- backends --------------------------------------------------------------------------------------------

BACKEND_MODULES = {
    "ptn_raises_at_import": "raise RuntimeError('the frobnicator SDK is not installed')\n",
    "ptn_syntax_error": "class Broken(:\n    pass\n",
    "ptn_abstract": """
        from pytest_ptn.backend import Availability, Backend

        class Bare(Backend):
            name = "bare"
            capabilities = frozenset()

        class Unfinished(Backend):
            name = "unfinished"
            capabilities = frozenset()

            @classmethod
            def availability(cls):
                return Availability(True)
        """,
    "ptn_bad_probe": """
        from pytest_ptn.backends.reference import ReferenceBackend

        class Crashes(ReferenceBackend):
            @classmethod
            def availability(cls):
                raise RuntimeError("probe crashed\\nwhile asking the driver")

        class ForgetsToReturn(ReferenceBackend):
            @classmethod
            def availability(cls):
                pass
        """,
}

BAD_SPECS = {
    "empty-module": (":Foo", "':Foo' is neither an installed backend nor a module:Class path"),
    "relative-module": (".rel:Foo", "'.rel:Foo' is neither an installed backend nor a module:Class path"),
    "raises-at-import": (
        "ptn_raises_at_import:Backend",
        "cannot import backend 'ptn_raises_at_import:Backend': "
        "RuntimeError: the frobnicator SDK is not installed",
    ),
    "syntax-error": (
        "ptn_syntax_error:Broken",
        "cannot import backend 'ptn_syntax_error:Broken': SyntaxError: ",
    ),
    "abstract": (
        "ptn_abstract:Bare",
        "backend 'ptn_abstract:Bare' is abstract: it does not implement availability, load, lower",
    ),
    "half-implemented": (
        "ptn_abstract:Unfinished",
        "backend 'ptn_abstract:Unfinished' is abstract: it does not implement load, lower",
    ),
}

BAD_PROBES = {
    "availability-raises": (
        "ptn_bad_probe:Crashes",
        "backend 'ptn_bad_probe:Crashes': availability() raised RuntimeError: "
        "probe crashed while asking the driver",
    ),
    "availability-returns-none": (
        "ptn_bad_probe:ForgetsToReturn",
        "backend 'ptn_bad_probe:ForgetsToReturn': availability() returned None, not an Availability",
    ),
}


@pytest.fixture
def backend_modules(pytester: pytest.Pytester) -> pytest.Pytester:
    for name, source in BACKEND_MODULES.items():
        pytester.makepyfile(**{name: textwrap.dedent(source)})
    pytester.syspathinsert()
    return pytester


@pytest.mark.parametrize(("spec", "complaint"), BAD_SPECS.values(), ids=BAD_SPECS.keys())
def test_bad_backend_is_a_one_line_usage_error(
    backend_modules: pytest.Pytester, spec: str, complaint: str
) -> None:
    line = usage_error(backend_modules.runpytest_inprocess(*QUIET, f"--ptn-backend={spec}"))
    assert line.startswith("ERROR: --ptn-backend: "), line
    assert complaint in line, line


@pytest.mark.parametrize(("spec", "complaint"), BAD_SPECS.values(), ids=BAD_SPECS.keys())
def test_resolving_a_bad_backend_raises_backend_error(
    backend_modules: pytest.Pytester, spec: str, complaint: str
) -> None:
    with pytest.raises(BackendError) as raised:
        resolve_backend(spec)
    assert complaint in str(raised.value)


@pytest.mark.parametrize(("spec", "complaint"), BAD_PROBES.values(), ids=BAD_PROBES.keys())
def test_broken_availability_is_a_one_line_usage_error(
    backend_modules: pytest.Pytester, spec: str, complaint: str
) -> None:
    line = usage_error(backend_modules.runpytest_inprocess(*QUIET, f"--ptn-backend={spec}"))
    assert line.startswith("ERROR: --ptn-backend: "), line
    assert complaint in line, line


@pytest.mark.parametrize(("spec", "complaint"), BAD_PROBES.values(), ids=BAD_PROBES.keys())
def test_asking_a_broken_backend_for_availability_raises_backend_error(
    backend_modules: pytest.Pytester, spec: str, complaint: str
) -> None:
    with pytest.raises(BackendError) as raised:
        availability_of(spec, resolve_backend(spec))
    assert complaint in str(raised.value)


def test_installed_entry_point_that_fails_to_import_is_a_one_line_usage_error(
    pytester: pytest.Pytester,
) -> None:
    """A distribution on sys.path registers ``ptn-broken``; its module needs an SDK that is missing."""
    pytester.makepyfile(ptn_broken_plugin="import no_such_frobnicator_sdk\n")
    info = pytester.mkdir("ptn_broken_plugin-1.0.dist-info")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ptn-broken-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pytest_ptn.backends]\nptn-broken = ptn_broken_plugin:Backend\n")
    pytester.syspathinsert()
    line = usage_error(pytester.runpytest_inprocess(*QUIET, "--ptn-backend=ptn-broken"))
    assert line.startswith("ERROR: --ptn-backend: "), line
    assert (
        "cannot import backend 'ptn-broken' (ptn_broken_plugin:Backend): "
        "ModuleNotFoundError: No module named 'no_such_frobnicator_sdk'"
    ) in line, line


# --- expectation files -----------------------------------------------------------------------------------

ENTRY = {
    "rule": '"E1"',
    "scenario": '"single_method"',
    "reason": '"a reason"',
    "link": '"https://github.com/pytorch/executorch/pull/1"',
}


def expectations_text(requires: str = '{ torch = ">=2" }', **fields: str) -> bytes:
    entry = "".join(f"{key} = {value}\n" for key, value in (ENTRY | fields).items())
    return f'backend = "reference"\nrequires = {requires}\n[[xfail]]\n{entry}'.encode()


BAD_FILES = {
    "rule-list": (expectations_text(rule='["E1"]'), "xfail #1: rule must be a string, not ['E1']"),
    "scenario-list": (
        expectations_text(scenario='["single_method"]'),
        "xfail #1: scenario must be a string, not ['single_method']",
    ),
    "scenario-number": (expectations_text(scenario="3"), "xfail #1: scenario must be a string, not 3"),
    "reason-number": (expectations_text(reason="42"), "xfail #1: reason must be a string, not 42"),
    "link-table": (
        expectations_text(link='{ url = "https://x" }'),
        "xfail #1: link must be a string, not {'url': 'https://x'}",
    ),
    "requires-number": (
        expectations_text(requires="{ torch = 2 }"),
        "requires.torch must be a version specifier string, not 2",
    ),
    "requires-list": (
        expectations_text(requires='{ torch = [">=2"] }'),
        "requires.torch must be a version specifier string, not ['>=2']",
    ),
    "not-utf8": (b'backend = "reference"\n# caf\xe9\n', "not UTF-8 text"),
}


@pytest.mark.parametrize(("content", "complaint"), BAD_FILES.values(), ids=BAD_FILES.keys())
def test_bad_expectations_file_is_a_one_line_usage_error(
    pytester: pytest.Pytester, content: bytes, complaint: str
) -> None:
    path = pytester.path / "bad.toml"
    path.write_bytes(content)
    line = usage_error(pytester.runpytest_inprocess(*QUIET, f"--ptn-expectations={path}"))
    assert line.startswith(f"ERROR: --ptn-expectations: {path}: "), line
    assert complaint in line, line


@pytest.mark.parametrize(("content", "complaint"), BAD_FILES.values(), ids=BAD_FILES.keys())
def test_reading_a_bad_expectations_file_raises_expectations_error(
    tmp_path: Path, content: bytes, complaint: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    with pytest.raises(expectations.ExpectationsError) as raised:
        expectations.read(path)
    assert str(raised.value).startswith(f"{path}: ")
    assert complaint in str(raised.value)
