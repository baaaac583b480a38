"""The zoo: upstream's own models as conformance scenarios.

Every other scenario is a program this project wrote; the zoo's are programs upstream exports, at a tiny size
with seeded random weights, in two families: ExecuTorch's own examples (``executorch.examples.models``,
built by pytest_ptn.programs.zoo_models) and Hugging Face models as optimum-executorch exports them (the
``[hf]`` extra, built by pytest_ptn.programs.zoo_optimum). Each is listed here as data, without torch, so
that ``list scenarios``, expectation files and test collection know them without building anything; the
tags are the ones its exported programs earn (programs.traits), plus ``zoo``, and a build checks that they
still are. A model that no longer builds as written here, because upstream changed it, or whose family is
not installed, is a skip that names what failed (ZooUnavailable), never an error of the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from pytest_ptn.programs.user import NamedProgram, UserScenario

ZOO_TAG = "zoo"
"""The tag (and pytest marker) of every zoo scenario: ``-m zoo``, ``-k zoo``, ``ptn_scenarios("zoo")``."""


class ZooUnavailable(RuntimeError):
    """A zoo model that cannot be built here: the distribution whose code it is is missing, or upstream
    changed the model so that it no longer builds as pytest-ptn builds it."""


@dataclass(frozen=True)
class ZooFamily:
    """Where a family of zoo models comes from."""

    module: str
    """The module of pytest-ptn whose functions build them."""
    distribution: str
    """The distribution whose code they are, named with its version in a skip."""
    needs: str
    """Why and how to install it, said when it is missing."""


EXAMPLES = ZooFamily(
    "pytest_ptn.programs.zoo_models", "executorch", "whose wheel ships the model (pip install executorch)"
)
OPTIMUM = ZooFamily(
    "pytest_ptn.programs.zoo_optimum",
    "optimum-executorch",
    "whose exportable modules export it (pip install 'pytest-ptn[hf]')",
)


@dataclass(frozen=True)
class ZooModel:
    """One zoo scenario: which upstream model, in which dtype, and the tags its programs earn."""

    name: str
    doc: str
    builder: str
    """The function of the family's module that builds it."""
    upstream: str
    """The upstream objects the builder uses, named in a skip when it fails."""
    dtype: str
    tags: frozenset[str]
    family: ZooFamily = EXAMPLES

    def program(self) -> NamedProgram:
        """The model as a NamedProgram; ZooUnavailable if upstream's code no longer builds it."""
        from pytest_ptn import upstream_noise

        try:
            with upstream_noise.contained():  # upstream's imports warn (executorch.exir's, torchao's)
                import importlib

                import torch

                module = importlib.import_module(self.family.module)
                build: Callable[[str, str, torch.dtype], NamedProgram] = getattr(module, self.builder)
                return build(self.name, self.doc, getattr(torch, self.dtype))
        except Exception as e:
            raise self._changed(e) from e

    def scenario(self) -> tuple[UserScenario, dict[str, ExportedProgram]]:
        """The model as a scenario with the functionalized programs its tags were read from; ZooUnavailable
        if it does not build, export or earn the listed tags any more."""
        from pytest_ptn.programs.user import UserScenario

        program = self.program()
        try:
            scenario, inspected = program.scenario()
        except Exception as e:
            raise self._changed(e) from e
        earned = scenario.tags | {ZOO_TAG}
        if earned != self.tags:
            raise ZooUnavailable(
                f"{self.name}: upstream's model ({self.upstream}) now exports a program tagged "
                f"{sorted(earned)}, not {sorted(self.tags)} as pytest-ptn lists it: its structure changed"
            )
        return UserScenario(self.name, self.doc, program, self.tags), inspected

    def _changed(self, error: Exception) -> ZooUnavailable:
        from importlib.metadata import PackageNotFoundError, version

        family = self.family
        try:
            installed = f"{family.distribution} {version(family.distribution)}"
        except PackageNotFoundError:
            return ZooUnavailable(f"{self.name} needs {family.distribution}, {family.needs}")
        return ZooUnavailable(
            f"{self.name}: upstream's model no longer builds as pytest-ptn builds it ({installed}; "
            f"{self.upstream}): {type(error).__name__}: {error}"
        )


def _zoo(name: str, doc: str, builder: str, upstream: str, *tags: str) -> tuple[ZooModel, ZooModel]:
    """The model in float32 and in bf16 (``<name>_bf16``), as LLMs ship."""
    tagset = frozenset({ZOO_TAG, "valid", *tags})
    return (
        ZooModel(name, f"{doc} (float32)", builder, upstream, "float32", tagset),
        ZooModel(f"{name}_bf16", f"{doc} (bf16)", builder, upstream, "bfloat16", tagset),
    )


LLAMA = (
    "executorch.examples.models.llama: ModelArgs + construct_transformer, use_kv_cache=True, static shapes"
)
VOXTRAL = (
    "executorch.examples.models.voxtral_realtime: VoxtralRealtimeModel + export_voxtral_rt's "
    "AudioEncoderExport, TokenEmbeddingExport, TextDecoderExport"
)

OPTIMUM_CAUSAL_LM = (
    "optimum.exporters.executorch: the text-generation task's load_causal_lm_model + "
    "CausalLMExportableModule (transformers LlamaForCausalLM)"
)
OPTIMUM_WHISPER = (
    "optimum.exporters.executorch: the automatic-speech-recognition task's load_seq2seq_speech_model + "
    "Seq2SeqLMExportableModule (transformers WhisperForConditionalGeneration)"
)
HF_TAGS = frozenset({ZOO_TAG, "valid", "buffers", "private_state"})
"""What optimum's exports hold: parameters and buffers, each name in one method, a KV cache per method."""

MODELS: tuple[ZooModel, ...] = (
    *_zoo(
        "zoo_llama",
        "upstream's llama, 2 layers, dim 64, random weights: prefill (5 tokens) then decode twice, sharing "
        "the KV cache; the rope tables and masks are non-persistent buffers, `rope` is reachable from the "
        "model and every layer",
        "llama",
        LLAMA,
        "buffers",
        "dedupe",
        "shared_state",
        "shared_weight",
    ),
    *_zoo(
        "zoo_voxtral",
        "upstream's Voxtral Realtime encoder-decoder, dims 32, random weights: audio_encoder, "
        "token_embedding, then text_decoder three times on its own KV cache; its output layer is the "
        "embedding table token_embedding reads under another name",
        "voxtral_realtime",
        VOXTRAL,
        "buffers",
        "dedupe",
        "private_state",
    ),
    ZooModel(
        "zoo_hf_llama",
        "a Hugging Face Llama, 2 layers, hidden 32, random weights, as optimum-executorch exports it: "
        "forward with keyword inputs and a dynamic sequence length over a static KV cache, 12 constant "
        "methods; a prefill of 5 tokens then two decodes of one, as its runner calls them",
        "causal_lm",
        OPTIMUM_CAUSAL_LM,
        "float32",
        HF_TAGS,
        OPTIMUM,
    ),
    ZooModel(
        "zoo_hf_whisper",
        "a Hugging Face Whisper, d_model 32, random weights, as optimum-executorch exports it: encoder, "
        "text_decoder with 8 mutated caches, sampler, static shapes; the encoder once, the decoder three "
        "tokens on its output, the sampler once",
        "whisper",
        OPTIMUM_WHISPER,
        "float32",
        HF_TAGS,
        OPTIMUM,
    ),
)

BY_NAME = {m.name: m for m in MODELS}


def tagged(*tags: str) -> list[ZooModel]:
    """Zoo models carrying every one of ``tags``."""
    return [m for m in MODELS if set(tags) <= m.tags]
