"""``python -m pytest_ptn --version`` and ``list``: what is installed, which rules each backend can show."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import pytest_ptn
from pytest_ptn import backend
from pytest_ptn.backend import (
    EXT_PREFIX,
    Availability,
    Backend,
    Capability,
    Loaded,
    Lowered,
    installed_backends,
)
from pytest_ptn.backends import probe_cache
from pytest_ptn.backends.pte import PteBackend
from pytest_ptn.backends.reference import ReferenceBackend
from pytest_ptn.cli import inventory, progress
from pytest_ptn.cli.main import main
from pytest_ptn.programs import zoo
from pytest_ptn.programs.catalogue import SCENARIOS
from pytest_ptn.ruleset import RULES, SPEC_VERSION, rules_shown

BACKENDS_PAGE = Path(__file__).parents[1] / "docs" / "backends.md"


def listed(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["list", *args]) == 0
    return capsys.readouterr().out


def test_version_is_the_distribution_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert pytest_ptn.__version__ == importlib.metadata.version("pytest-ptn")
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert (
        capsys.readouterr().out.strip()
        == f"pytest-ptn {pytest_ptn.__version__} (conformance spec v{SPEC_VERSION})"
    )


def test_rules_shown_follow_capabilities() -> None:
    assert rules_shown(ReferenceBackend) == dict.fromkeys(RULES, "")
    pte = rules_shown(PteBackend)
    assert sorted(pte) == ["A1", "E1", "E2", "E3", "E4", "E5", "X1"]
    assert "only where lowering rejects" in pte["X1"]
    assert all(not pte[r] for r in pte if r != "X1")


def test_summary_names_whole_families_and_marks_conditional_rules() -> None:
    assert inventory.summarize_rules(rules_shown(ReferenceBackend)) == "P E S X A"
    assert inventory.summarize_rules(rules_shown(PteBackend)) == "E X1? A"
    shown = {"E1": "", "S6": "", "X1": "only sometimes"}
    assert inventory.summarize_rules(shown) == "E1 S6 X1?"
    assert inventory.summarize_rules({}) == "none"


@pytest.fixture
def installed_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``list backends`` without the ext: flows, which the cold listing below checks (seconds each here)."""
    monkeypatch.setattr(inventory, "ext_flows", lambda status: [])


@pytest.mark.usefixtures("installed_only")
def test_list_backends_text(capsys: pytest.CaptureFixture[str]) -> None:
    out = listed(capsys, "backends")
    lines = {line.split()[0]: line.split() for line in out.splitlines()[1:] if line}
    assert set(installed_backends()) <= set(lines)
    assert lines["reference"][:2] == ["reference", "yes"]
    assert "P E S X A" in " ".join(lines["reference"])
    assert " E X1? A " in f" {' '.join(lines['pte'])} "
    assert "X1?: applies only where lowering rejects" in out


@pytest.mark.usefixtures("installed_only")
def test_list_backends_json(capsys: pytest.CaptureFixture[str]) -> None:
    by_name = {b["name"]: b for b in json.loads(listed(capsys, "backends", "--json"))}
    assert {name for name in by_name if not name.startswith(EXT_PREFIX)} == set(installed_backends())
    reference = by_name["reference"]
    assert reference["available"] is True
    assert reference["capabilities"] == [c.value for c in Capability if c is not Capability.QUANTIZE]
    assert set(reference["versions"]) == {"torch", "safetensors"}
    assert reference["rules"] == dict.fromkeys(RULES, "")
    assert "X2" not in by_name["pte"]["rules"]
    assert by_name["pte"]["rules"]["X1"]


class Unavailable(Backend):
    name = "unavailable"
    capabilities = frozenset({Capability.EXECUTE})

    @classmethod
    def availability(cls) -> Availability:
        return Availability(False, "needs a flux capacitor")

    def lower(self, programs: Any, workdir: Path) -> Lowered:
        raise NotImplementedError

    def load(self, lowered: Lowered) -> Loaded:
        raise NotImplementedError


@pytest.mark.usefixtures("installed_only")
def test_unavailable_and_broken_backends_are_listed_with_why(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    group = "pytest_ptn.backends"
    entry_points = {
        "unavailable": importlib.metadata.EntryPoint("unavailable", f"{__name__}:Unavailable", group),
        "broken": importlib.metadata.EntryPoint("broken", "no_such_module_for_ptn:Backend", group),
    }
    monkeypatch.setattr(backend, "installed_backends", lambda: entry_points)
    monkeypatch.setattr(inventory, "installed_backends", lambda: entry_points)
    out = listed(capsys, "backends")
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert rows["unavailable"].split()[1:4] == ["no", "execute", "E"]
    assert rows["unavailable"].endswith("needs a flux capacitor")
    assert rows["broken"].split()[1] == "no"
    assert "cannot load the backend" in rows["broken"]
    assert "no_such_module_for_ptn" in rows["broken"]


def test_list_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    lines = listed(capsys, "scenarios").splitlines()
    assert lines[0].split() == ["scenario", "tags", "description"]
    assert [line.split()[0] for line in lines[1:]] == [s.name for s in SCENARIOS] + [
        m.name for m in zoo.MODELS
    ]
    by_name = {s["name"]: s for s in json.loads(listed(capsys, "scenarios", "--json"))}
    assert by_name["method_named_state"]["tags"] == ["P6", "reject"]
    assert by_name["kv_cache"]["description"].startswith("A shared KV cache")


def test_list_rules(capsys: pytest.CaptureFixture[str]) -> None:
    rows = {line.split()[0]: line for line in listed(capsys, "rules").splitlines()[1:]}
    assert list(rows) == list(RULES)
    assert rows["P9"].split()[1:3] == ["SHOULD", "deterministic"]
    assert rows["S6"].split()[-2:] == ["execute,", "memory"]
    assert "without package, only where lowering rejects" in rows["X1"]
    by_id = {r["id"]: r for r in json.loads(listed(capsys, "rules", "--json"))}
    assert by_id["X1"]["needs"] == []
    assert by_id["X2"]["needs"] == ["package"]
    assert by_id["S1"]["needs"] == ["execute", "storage"]


def test_listing_imports_neither_torch_nor_executorch_but_for_the_ext_flows() -> None:
    """Only executorch's registry can list its flows; the installed backends, scenarios and rules are free."""
    script = (
        "import sys\n"
        "import pytest_ptn\n"
        "from pytest_ptn import inventory\n"
        "from pytest_ptn.cli.main import main\n"
        "pytest_ptn.__version__\n"
        "for what in ('scenarios', 'rules'):\n"
        "    main(['list', what])\n"
        "print(inventory.render_backends(inventory.backends()))\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'executorch'))\n"
        "print('HEAVY', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "reference" in result.stdout
    assert result.stdout.splitlines()[-1] == "HEAVY []"


def test_a_cold_list_backends_shows_every_ext_flow_and_says_on_stderr_only_what_it_probes(
    tmp_path: Path,
) -> None:
    """The first listing in an environment probes each flow whose delegate this runtime lacks (a minute and
    more): stdout is the JSON alone, and stderr, a log here, names each probe as it starts and holds none of
    the lines upstream prints meanwhile (torchao's ``Failed to load ... _C_mxfp8...so``, torch's pytree
    warnings), as a run holds them. The next listing probes nothing, and says nothing."""
    pytest.importorskip("executorch")
    cache = tmp_path / "probes"
    env = {**os.environ, probe_cache.CACHE_ENV: str(cache)}
    command = [sys.executable, "-m", "pytest_ptn", "list", "backends", "--json"]
    cold = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert cold.returncode == 0, cold.stderr
    by_name = {b["name"]: b for b in json.loads(cold.stdout)}
    ext_rows = {name: b for name, b in by_name.items() if name.startswith(EXT_PREFIX)}
    assert {"ext:portable", "ext:xnnpack", "ext:xnnpack_dynamic_int8_per_channel"} <= set(ext_rows)
    assert ext_rows["ext:portable"]["available"] is True
    assert ext_rows["ext:portable"]["rules"] == by_name["pte"]["rules"]
    quantized = ext_rows["ext:xnnpack_dynamic_int8_per_channel"]
    assert quantized["available"] is True and "quantize" in quantized["capabilities"]
    coreml = ext_rows.get("ext:coreml")
    if coreml is not None:  # registered where coremltools imports: it lowers, the pip runtime cannot load it
        assert not coreml["available"]
        assert "lowers and writes a .pte here, but this runtime has no CoreMLBackend" in coreml["reason"]
    if importlib.util.find_spec("tosa_serializer") is None:  # the package to install, not only the module
        reason = ext_rows["ext:arm*"]["reason"]
        hint = "(module of tosa-tools: pip install 'pytest-ptn[arm]')"
        assert f"No module named 'tosa_serializer' {hint}" in reason

    probed = {
        name
        for name, b in ext_rows.items()
        if "lowers and writes a .pte here" in b["reason"] or "does not lower here" in b["reason"]
    }
    said = cold.stderr.splitlines()
    assert sorted(said) == sorted(
        f"list backends: probing {name} (once per environment: kept in {cache})" for name in probed
    ), cold.stderr
    assert len(list(cache.iterdir())) == len(probed)

    warm = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert warm.returncode == 0, warm.stderr
    assert (json.loads(warm.stdout), warm.stderr) == (json.loads(cold.stdout), "")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_one_line_rewritten_on_a_terminal_and_slow_steps_alone_in_a_log() -> None:
    terminal = Terminal()
    shown = progress.Status(terminal)
    shown.update("list backends: 1/2 ext: flows")
    shown.note("list backends: probing ext:x")
    shown.clear()
    assert terminal.getvalue() == (
        "\rlist backends: 1/2 ext: flows\x1b[K\rlist backends: probing ext:x\x1b[K\r\x1b[K"
    )
    log = io.StringIO()
    logged = progress.Status(log)
    logged.update("list backends: 1/2 ext: flows")
    logged.note("list backends: probing ext:x")
    logged.clear()
    assert log.getvalue() == "list backends: probing ext:x\n"


def test_what_native_code_prints_while_held_is_shown_only_if_the_listing_fails(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Held at the file descriptors, where native code and logging's handlers write (a run captures them
    there too); a listing that fails shows it, to explain the failure."""
    with progress.held():
        os.write(1, b"upstream on stdout\n")
        os.write(2, b"upstream on stderr\n")
    assert capfd.readouterr() == ("", "")
    with pytest.raises(RuntimeError, match="failed"), progress.held():
        os.write(2, b"upstream before the failure\n")
        raise RuntimeError("failed")
    assert capfd.readouterr() == ("", "upstream before the failure\n")


def documented_backend_rules() -> dict[str, str]:
    """The docs' backends table: backend name -> its rules column."""
    section = BACKENDS_PAGE.read_text().split("\n## ", 1)[0]
    table = section[section.index("| name |") :].split("\n\n", 1)[0]  # the page's first table
    rows = [line.strip("|").split("|") for line in table.splitlines()]
    header = [cell.strip() for cell in rows[0]]
    name, rules = header.index("name"), header.index("rules")
    return {row[name].strip().strip("`"): row[rules].strip() for row in rows[2:]}


def test_documented_backends_table_agrees_with_the_capabilities() -> None:
    table = documented_backend_rules()
    backends = {b.name: b for b in inventory.backends()}
    assert set(table) == set(backends)
    wrong = {
        name: (table[name], expected)
        for name, b in backends.items()
        if table[name] != (expected := inventory.summarize_rules(b.rules))
    }
    assert not wrong, f"docs/backends.md rules column (written, from the data): {wrong}"
