"""The zoo (pytest_ptn.programs.zoo): upstream's own models build from the installed executorch at a tiny
size, earn the tags they are listed with, exercise what they are there for, run clean on the reference
backend in float32, and a model that upstream changed is a skip naming the change, never an error. The
optimum-executorch family's builds are tests/test_optimum.py's (they need the [hf] extra)."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pytest_ptn import expectations
from pytest_ptn.cli import main as cli
from pytest_ptn.programs import zoo, zoo_models
from pytest_ptn.programs.user import UserScenario

EXAMPLES = [m.name for m in zoo.MODELS if m.family is zoo.EXAMPLES]
FLOAT32 = [name for name in EXAMPLES if zoo.BY_NAME[name].dtype == "float32"]


@pytest.fixture(scope="module")
def built() -> Callable[[str], UserScenario]:
    """Each zoo model as a scenario, built once for this module (a build exports every method)."""
    cache: dict[str, UserScenario] = {}

    def get(name: str) -> UserScenario:
        if name not in cache:
            cache[name] = zoo.BY_NAME[name].scenario()[0]
        return cache[name]

    return get


def test_the_zoo_has_an_llm_with_a_kv_cache_and_an_encoder_decoder_in_two_dtypes() -> None:
    assert {m.dtype for m in zoo.MODELS} == {"float32", "bfloat16"}
    assert {"zoo_llama", "zoo_llama_bf16", "zoo_voxtral", "zoo_voxtral_bf16"} <= set(zoo.BY_NAME)
    assert all(zoo.ZOO_TAG in m.tags and "valid" in m.tags for m in zoo.MODELS)


@pytest.mark.parametrize("name", EXAMPLES)
def test_model_builds_exports_and_earns_its_listed_tags(
    name: str, built: Callable[[str], UserScenario]
) -> None:
    scenario = built(name)  # zoo.ZooUnavailable if the tags its programs earn differ from the listed ones
    model = zoo.BY_NAME[name]
    assert scenario.tags == model.tags
    dtypes = {p.dtype for p in scenario.program.export()[scenario.program.method_names[0]].parameters()}
    assert dtypes == {getattr(torch, model.dtype)}


def test_llama_decode_reads_what_prefill_cached_and_its_norms_are_random(
    built: Callable[[str], UserScenario],
) -> None:
    program = built("zoo_llama").program
    after_prefill = program.eager()[1]
    assert after_prefill.method == "decode"
    alone = program.run_eager(("decode",))[0]  # decode on a fresh model: an empty KV cache
    assert not torch.allclose(alone.outputs[0], after_prefill.outputs[0])
    norms = [p for n, p in program.export()["decode"].named_parameters() if "norm" in n]
    assert norms and not any(torch.equal(p, torch.ones_like(p)) for p in norms)


def test_voxtral_output_layer_is_the_embedding_table(built: Callable[[str], UserScenario]) -> None:
    exported = built("zoo_voxtral").program.export()
    table = exported["token_embedding"].state_dict["tok_embeddings.weight"]
    assert torch.equal(exported["text_decoder"].state_dict["decoder.output.weight"], table)


@pytest.mark.parametrize("name", FLOAT32)
def test_float32_model_is_clean_on_reference(
    name: str, built: Callable[[str], UserScenario], tmp_path: Path
) -> None:
    from pytest_ptn.backends.reference import ReferenceBackend
    from pytest_ptn.harness import Case

    case = Case(ReferenceBackend(), built(name), lambda step: tmp_path)
    loaded = case.load()
    assert case.run_sequence(loaded) == []
    state = loaded.state()
    for key, want in case.eager()[-1].state_after.items():
        assert torch.equal(state[key], want), key


def test_model_upstream_changed_names_the_change(monkeypatch: pytest.MonkeyPatch) -> None:
    def changed(name: str, doc: str, dtype: torch.dtype) -> None:
        raise TypeError("ModelArgs.__init__() got an unexpected keyword argument 'max_context_len'")

    monkeypatch.setattr(zoo_models, "llama", changed)
    with pytest.raises(zoo.ZooUnavailable) as raised:
        zoo.BY_NAME["zoo_llama"].scenario()
    message = str(raised.value)
    assert message.startswith("zoo_llama: upstream's model no longer builds as pytest-ptn builds it")
    assert "executorch.examples.models.llama: ModelArgs + construct_transformer" in message
    assert "TypeError: ModelArgs.__init__() got an unexpected keyword argument 'max_context_len'" in message


def test_without_executorch_the_zoo_says_what_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(dist: str) -> str:
        raise importlib.metadata.PackageNotFoundError(dist)

    _broken_builders(monkeypatch)
    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(
        zoo.ZooUnavailable, match=r"^zoo_voxtral needs executorch, whose wheel ships the model"
    ):
        zoo.BY_NAME["zoo_voxtral"].program()


def test_without_optimum_the_hf_family_says_what_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(dist: str) -> str:
        raise importlib.metadata.PackageNotFoundError(dist)

    _broken_builders(monkeypatch)
    monkeypatch.setattr(importlib.metadata, "version", missing)
    for name in ("zoo_hf_llama", "zoo_hf_whisper"):
        with pytest.raises(zoo.ZooUnavailable) as raised:
            zoo.BY_NAME[name].program()
        needs = "whose exportable modules export it (pip install 'pytest-ptn[hf]')"
        assert str(raised.value) == f"{name} needs optimum-executorch, {needs}"


def test_model_whose_structure_changed_names_the_tags() -> None:
    listed = dataclasses.replace(zoo.BY_NAME["zoo_llama"], tags=zoo.BY_NAME["zoo_voxtral"].tags)
    with pytest.raises(zoo.ZooUnavailable, match=r"now exports a program tagged \[.*'shared_state'"):
        listed.scenario()


def _broken_builders(monkeypatch: pytest.MonkeyPatch) -> None:
    def gone(name: str, doc: str, dtype: torch.dtype) -> None:
        raise ImportError("cannot import name 'construct_transformer' from 'llama_transformer'")

    for model in zoo.MODELS:
        monkeypatch.setattr(importlib.import_module(model.family.module), model.builder, gone)


def test_changed_model_is_a_skip_in_the_suite(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _broken_builders(monkeypatch)
    result = pytester.runpytest_inprocess(
        "--ptn-backend=reference", "--ptn-zoo", "-k", "zoo_llama and not bf16", "-m", "E1 or E2", "-rs"
    )
    assert result.parseoutcomes().get("skipped") == 3 and result.ret == pytest.ExitCode.OK, result.outlines
    result.stdout.fnmatch_lines(
        [
            "*zoo_llama: upstream's model no longer builds*"
            "ImportError: cannot import name 'construct_transformer'*"
        ]
    )


def test_zoo_is_opt_in_and_collected_without_building(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _broken_builders(monkeypatch)  # collection must not build: a build would fail here
    default = pytester.runpytest_inprocess("--ptn-backend=reference", "--collect-only", "-q")
    assert not [line for line in default.outlines if "zoo_" in line]
    opted = pytester.runpytest_inprocess(
        "--ptn-backend=reference", "--ptn-zoo", "-m", "zoo", "--collect-only", "-q"
    )
    ids = [line for line in opted.outlines if "::" in line]
    assert ids and all("zoo_" in line for line in ids), opted.outlines
    assert {name for name in zoo.BY_NAME if any(f"-{name}]" in line for line in ids)} == set(zoo.BY_NAME)


def test_list_scenarios_shows_the_zoo(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", "scenarios", "--json"]) == 0
    listed = {s["name"]: s["tags"] for s in json.loads(capsys.readouterr().out)}
    assert all(zoo.ZOO_TAG in listed[name] for name in zoo.BY_NAME)


def test_expectation_files_can_name_zoo_scenarios(tmp_path: Path) -> None:
    known = tmp_path / "known.toml"
    known.write_text(
        'backend = "native"\n[[xfail]]\nrule = "E1"\nscenario = "zoo_llama_bf16"\nreason = "r"\nlink = ""\n'
    )
    assert [e.scenario for e in expectations.read(known).entries] == ["zoo_llama_bf16"]
