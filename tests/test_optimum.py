"""Programs as optimum-executorch exports them (the ``[hf]`` extra; skipped without it): a causal LM, a
Whisper and a multimodal model built from transformers config objects with random weights, through
check_program as optimum returns them; the zoo's optimum family; the docs' example. Each model is
built once per session (an export takes seconds, importing transformers more)."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pytest_ptn import upstream_noise
from pytest_ptn.check import check_program
from pytest_ptn.programs import zoo, zoo_optimum
from pytest_ptn.programs.user import NamedProgram
from pytest_ptn.programs.zoo_models import SEED, randomize

pytestmark = pytest.mark.extra("hf")

CHECK_PAGE = Path(__file__).parents[1] / "docs" / "check-program.md"
HF = ["zoo_hf_llama", "zoo_hf_whisper"]


@pytest.fixture(scope="session", autouse=True)
def optimum_installed() -> None:
    """Imports optimum's task modules once, their upstream import-time warnings (executorch's, torchao's)
    contained, so that the docs' example meets them imported."""
    with upstream_noise.contained():
        import optimum.exporters.executorch.tasks.asr  # noqa: F401
        import optimum.exporters.executorch.tasks.causal_lm  # noqa: F401
        import optimum.exporters.executorch.tasks.multimodal_text_to_text  # noqa: F401


@pytest.fixture(scope="session")
def built() -> Callable[[str], NamedProgram]:
    """Each program, built once: the zoo's two, and ``multimodal``."""
    cache: dict[str, NamedProgram] = {}

    def get(name: str) -> NamedProgram:
        if name not in cache:
            cache[name] = multimodal() if name == "multimodal" else zoo.BY_NAME[name].program()
        return cache[name]

    return get


def multimodal() -> NamedProgram:
    """A Gemma 3 (text hidden 32, a one-layer SigLIP vision tower on 28x28 images) through optimum's
    ``image-text-to-text`` loader and ``MultiModalTextToTextExportableModule``: ``text_decoder`` and
    ``vision_encoder`` of keyword inputs, ``token_embedding`` holding the decoder's embedding table. Its
    vision example input is a random image: optimum fetches a picture from the network for it."""
    from optimum.exporters.executorch import integrations
    from optimum.exporters.executorch.tasks.multimodal_text_to_text import load_multimodal_text_to_text_model
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    text = Gemma3TextConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=32,
        sliding_window=16,
        layer_types=["full_attention", "full_attention"],
    )
    vision = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
    )
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        image_token_index=299,
        boi_token_index=297,
        eoi_token_index=298,
    )
    generator = torch.Generator().manual_seed(SEED)
    image = torch.rand(1, 3, 28, 28, generator=generator)
    with zoo_optimum.quiet(), tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
        with torch.random.fork_rng():
            model = Gemma3ForConditionalGeneration(config)
        randomize(model, generator)
        model.save_pretrained(folder)
        vision_inputs = lambda self: (image, None)  # noqa: E731
        patch.setattr(integrations.VisionExportableModule, "prepare_export_inputs", vision_inputs)
        exportable = load_multimodal_text_to_text_model(folder, max_length=32)
        programs = exportable.export()
    tokens = torch.randint(0, 296, (1, 5), generator=generator)
    embeds = [torch.randn(1, n, 32, generator=generator) for n in (4, 1)]
    calls = [
        ("vision_encoder", {"input_features": torch.rand(1, 3, 28, 28, generator=generator)}),
        ("token_embedding", (tokens[:, :4],)),
        ("text_decoder", {"inputs_embeds": embeds[0], "cache_position": torch.arange(4)}),
        ("token_embedding", (tokens[:, 4:],)),
        ("text_decoder", {"inputs_embeds": embeds[1], "cache_position": torch.tensor([4])}),
    ]
    return NamedProgram(
        "multimodal",
        {**exportable.metadata, **programs},
        {method: ep.example_inputs for method, ep in programs.items()},
        calls,
    )


@pytest.mark.parametrize("name", [*HF, "multimodal"])
def test_optimum_exports_are_checked_as_optimum_returns_them(
    name: str, built: Callable[[str], NamedProgram]
) -> None:
    """Keyword-only methods, example inputs with autograd history (Whisper's decoder), constant methods,
    decodes of one token on a length declared from 0: no exception, no finding on reference, and the
    check says that no name collides across methods, so P1, S2 and S3 had no collision to check. The zoo's
    programs earn the tags the zoo lists; the multimodal token_embedding holds the decoder's own table."""
    program = built(name)
    findings = check_program(program.model, program.inputs, program.calls, backend="reference")
    assert findings == []
    assert (
        "no constant name appears in two methods: P1, S2, S3 had no collision to check"
        in findings.hazards.lines()
    )
    assert "get_max_seq_len" in findings.hazards.constant_methods
    if name in zoo.BY_NAME:
        assert program.scenario()[0].tags | {zoo.ZOO_TAG} == zoo.BY_NAME[name].tags
    else:
        table = (
            ("text_decoder", "model.model.language_model.embed_tokens.weight"),
            ("token_embedding", "weight"),
        )
        assert findings.hazards.shared == (table,)


def test_a_model_optimum_changed_is_named_in_the_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    def changed(name: str, doc: str, dtype: torch.dtype) -> None:
        """load_causal_lm_model() got an unexpected keyword argument 'max_seq_len'"""
        raise TypeError(changed.__doc__)

    monkeypatch.setattr(zoo_optimum, "causal_lm", changed)
    with pytest.raises(zoo.ZooUnavailable) as raised:
        zoo.BY_NAME["zoo_hf_llama"].program()
    message = str(raised.value)
    named = r"zoo_hf_llama: upstream's model no longer builds .* \(optimum-executorch 1\.\d+\.\d+; "
    assert re.match(named, message), message
    assert message.endswith(f"TypeError: {changed.__doc__}")


def test_the_docs_optimum_example_runs() -> None:
    section = CHECK_PAGE.read_text().split("\n## Programs optimum-executorch exports\n", 1)[1]
    section = section.split("\n#", 1)[0]
    (example,) = re.findall(r"```python\n(.*?)```", section, re.S)
    exec(compile(example, "docs/check-program.md", "exec"), {})
