"""The zoo's Hugging Face programs, exported by optimum-executorch's own task loaders and exportable modules
(the ``[hf]`` extra), from transformers config objects at a tiny size with seeded random weights: nothing is
downloaded (the model is saved to a temporary folder that optimum's loader reads).

Each program is what optimum hands its recipes: the ExportedPrograms of ``module.export()`` (one method
renamed ``forward``, as its recipes rename a lone method) and its constant methods (``module.metadata``),
in the order its runner loads them (constant methods, then the encoder, then the decoder), called as its
runner calls them: keyword inputs where the program takes keywords, a prefill then decodes of one token.
pytest_ptn.programs.zoo lists them and turns a build that fails because optimum changed into a skip.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from pytest_ptn.programs.user import NamedProgram
from pytest_ptn.programs.zoo_models import SEED, randomize

PROMPT_TOKENS = 5
"""The causal LM's prefill length; its decodes write the positions after it."""
MAX_SEQ_LEN = 16
"""The KV cache length optimum sizes (``max_seq_len``); the prefill and decodes stay inside it."""
WHISPER_FRAMES = 100
"""Mel frames the tiny feature extractor pads to (1 s at hop 160): the encoder's static input length."""


@contextmanager
def quiet() -> Iterator[None]:
    """transformers' progress bars and notices off while a model is saved and loaded, as they were after."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _saved(model: torch.nn.Module, folder: Path, generator: torch.Generator) -> None:
    randomize(model, generator)
    model.save_pretrained(folder)  # type: ignore[operator]


def causal_lm(name: str, doc: str, dtype: torch.dtype) -> NamedProgram:
    """A 2-layer Llama (hidden 32, 4 heads over 2 KV heads, vocabulary 64) through optimum's
    ``text-generation`` loader and ``CausalLMExportableModule``: ``forward(input_ids=, cache_position=)``
    with a dynamic sequence length and a static KV cache, and 12 constant methods. Prefill of 5 tokens,
    then two decodes of one."""
    from optimum.exporters.executorch.tasks.causal_lm import load_causal_lm_model
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = 64
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_SEQ_LEN,
        bos_token_id=1,
        eos_token_id=2,
    )
    generator = torch.Generator().manual_seed(SEED)
    with quiet(), tempfile.TemporaryDirectory() as folder:
        with torch.random.fork_rng():
            model = LlamaForCausalLM(config)
        _saved(model, Path(folder), generator)
        exportable = load_causal_lm_model(
            folder, dtype=str(dtype).removeprefix("torch."), max_seq_len=MAX_SEQ_LEN
        )
        (program,) = exportable.export().values()
    tokens = torch.randint(0, vocab, (1, PROMPT_TOKENS + 2), generator=generator)
    calls = [
        ("forward", {"input_ids": tokens[:, :PROMPT_TOKENS], "cache_position": torch.arange(PROMPT_TOKENS)}),
        *(
            ("forward", {"input_ids": tokens[:, i : i + 1], "cache_position": torch.tensor([i])})
            for i in (PROMPT_TOKENS, PROMPT_TOKENS + 1)
        ),
    ]
    return NamedProgram(
        name,
        {**exportable.metadata, "forward": program},
        inputs={"forward": program.example_inputs},
        calls=calls,
        doc=doc,
    )


def whisper(name: str, doc: str, dtype: torch.dtype) -> NamedProgram:
    """A Whisper (d_model 32, one encoder layer, two decoder layers, 8 mel bins over 100 frames) through
    optimum's ``automatic-speech-recognition`` loader and ``Seq2SeqLMExportableModule``: ``encoder``,
    ``text_decoder`` (its self- and cross-attention caches, 8 mutated buffers) and ``sampler``, static
    shapes. As optimum's runner calls them: the encoder once, then the decoder token by token on its output;
    the sampler, which that runner leaves to the host, once on the last logits."""
    from optimum.exporters.executorch.tasks.asr import load_seq2seq_speech_model
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=64,
        num_mel_bins=8,
        d_model=32,
        encoder_layers=1,
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_layers=2,
        decoder_attention_heads=2,
        decoder_ffn_dim=64,
        max_source_positions=WHISPER_FRAMES // 2,
        max_target_positions=MAX_SEQ_LEN,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    generator = torch.Generator().manual_seed(SEED)
    with quiet(), tempfile.TemporaryDirectory() as folder:
        with torch.random.fork_rng():
            model = WhisperForConditionalGeneration(config)
        _saved(model, Path(folder), generator)
        extractor = WhisperFeatureExtractor(
            feature_size=config.num_mel_bins, chunk_length=1, hop_length=160, sampling_rate=16000
        )
        extractor.save_pretrained(folder)
        exportable = load_seq2seq_speech_model(
            folder, dtype=str(dtype).removeprefix("torch."), max_seq_len=MAX_SEQ_LEN
        )
        with torch.random.fork_rng():  # its example encoder input is drawn from the global generator
            programs = exportable.export()
    mel = torch.randn(1, config.num_mel_bins, WHISPER_FRAMES, generator=generator).to(dtype)
    with torch.no_grad():
        heard = programs["encoder"].module()(mel)
    tokens = [
        config.decoder_start_token_id,
        *torch.randint(3, config.vocab_size, (2,), generator=generator).tolist(),
    ]
    steps = [
        ("text_decoder", (torch.tensor([[token]]), heard, torch.tensor([i])))
        for i, token in enumerate(tokens)
    ]
    logits = torch.randn(1, 1, config.vocab_size, generator=generator).to(dtype)
    return NamedProgram(
        name,
        {**exportable.metadata, **programs},
        inputs={method: ep.example_inputs for method, ep in programs.items()},
        calls=[("encoder", (mel,)), *steps, ("sampler", (logits,))],
        doc=doc,
    )
