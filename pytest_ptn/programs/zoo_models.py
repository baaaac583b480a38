"""The zoo's programs, built from upstream's own model definitions in the installed executorch wheel
(``executorch.examples.models``) at a tiny size with seeded random weights: nothing is downloaded.

pytest_ptn.programs.zoo lists them, with the upstream objects each uses, and turns a build that fails
because upstream changed those into a skip. Every weight is random, norms included (all-ones
norms would hide a backend that drops them), drawn from a generator with a fixed seed, so a zoo
program is the same in every run and process (the global RNG is left as it was).
"""

from __future__ import annotations

import torch
from torch import nn

from pytest_ptn.programs.user import NamedProgram

SEED = 22
"""Seed of every zoo model's weights and call inputs."""

PREFILL_TOKENS = 5
"""llama's prefill length; decode then writes the positions after it (max_context_len covers both)."""


def randomize(model: nn.Module, generator: torch.Generator) -> None:
    """Every parameter drawn anew: norm scales around 1, other weights scaled by their fan-in."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(noise / p[0].numel() ** 0.5 if p.dim() > 1 else 0.1 * noise)


class LlamaMethods(nn.Module):
    """upstream's llama with the two methods its export ships with a static-shape KV cache: ``prefill``
    (several tokens) and ``decode`` (one), both ``forward(tokens, {"input_pos": positions})``, sharing the
    model and so its KV cache."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def prefill(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        return self.model(tokens, {"input_pos": input_pos})

    def decode(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        return self.model(tokens, {"input_pos": input_pos})


def llama(name: str, doc: str, dtype: torch.dtype) -> NamedProgram:
    """A 2-layer llama (dim 64, grouped-query attention, vocabulary 32, context 8) with a KV cache: prefill
    of 5 tokens, then decode at positions 5 and 6 reading what prefill cached."""
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    args = ModelArgs(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        hidden_dim=128,
        vocab_size=32,
        max_seq_len=8,
        max_context_len=8,
        max_batch_size=1,
        use_kv_cache=True,
        enable_dynamic_shape=False,
    )
    generator = torch.Generator().manual_seed(SEED)
    with torch.random.fork_rng():
        model = construct_transformer(args)
    randomize(model, generator)
    program = LlamaMethods(model.to(dtype)).eval()
    tokens = torch.randint(0, args.vocab_size, (1, PREFILL_TOKENS + 2), generator=generator)
    prefill = (tokens[:, :PREFILL_TOKENS], torch.arange(PREFILL_TOKENS))
    decode = [(tokens[:, i : i + 1], torch.tensor([i])) for i in (PREFILL_TOKENS, PREFILL_TOKENS + 1)]
    return NamedProgram(
        name,
        program,
        inputs={"prefill": prefill, "decode": decode[0]},
        calls=[("prefill", prefill), *(("decode", d) for d in decode)],
        doc=doc,
    )


def voxtral_realtime(name: str, doc: str, dtype: torch.dtype) -> NamedProgram:
    """Voxtral Realtime offline, as upstream exports it (three methods of one model): ``audio_encoder`` (a
    causal whisper encoder + adapter), ``token_embedding`` and ``text_decoder`` (a Mistral decoder with a
    KV cache whose output layer is the embedding table: one weight in two methods). Tiny: dims 32, one layer
    each, 8 mel bins, context 8; the standard-op variant upstream exports for AOTInductor (``backend
    "cuda"``: index_copy_ KV cache, F.scaled_dot_product_attention), since the portable one needs
    executorch's custom ops. One decoder token per call, the static shape upstream uses for native
    runners; the RoPE tables float32 as upstream's loader leaves them."""
    from executorch.examples.models.voxtral_realtime.export_voxtral_rt import (
        AudioEncoderExport,
        TextDecoderExport,
        TokenEmbeddingExport,
    )
    from executorch.examples.models.voxtral_realtime.model import (
        VoxtralRealtimeConfig,
        VoxtralRealtimeModel,
        compute_time_embedding,
        precompute_freqs_cis,
    )

    config = VoxtralRealtimeConfig(
        dim=32,
        n_layers=1,
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        hidden_dim=64,
        vocab_size=32,
        ada_rms_norm_t_cond_dim=8,
        enc_dim=32,
        enc_n_layers=1,
        enc_n_heads=4,
        enc_head_dim=8,
        enc_hidden_dim=64,
        num_mel_bins=8,
        downsample_factor=4,
        max_seq_len=8,
        backend="cuda",
    )
    mel_frames = 16  # a multiple of 8: the encoder halves it, the adapter groups 4
    generator = torch.Generator().manual_seed(SEED)
    with torch.random.fork_rng():
        model = VoxtralRealtimeModel(config)
    randomize(model, generator)
    model.to(dtype)
    # As upstream's load_model: RoPE tables float32, the time embedding in the model's dtype. The encoder's
    # table keeps only the rows a 16-frame mel reads (upstream sizes it for 16384 frames: 512 KiB).
    enc_cos, enc_sin = precompute_freqs_cis(config.enc_head_dim, mel_frames, config.enc_rope_theta)
    model.encoder.register_buffer("freqs_cos", enc_cos)
    model.encoder.register_buffer("freqs_sin", enc_sin)
    dec_cos, dec_sin = precompute_freqs_cis(config.head_dim, config.max_seq_len, config.rope_theta)
    model.decoder.register_buffer("freqs_cos", dec_cos)
    model.decoder.register_buffer("freqs_sin", dec_sin)
    model.register_buffer("t_cond", compute_time_embedding(6, config.dim).to(dtype))
    model.eval()
    methods = {
        "audio_encoder": AudioEncoderExport(model),
        "token_embedding": TokenEmbeddingExport(model),
        "text_decoder": TextDecoderExport(model),
    }
    mel = torch.randn(1, config.num_mel_bins, mel_frames, generator=generator).to(dtype)
    token = torch.randint(0, config.vocab_size, (1, 1), generator=generator)
    embeds = [torch.randn(1, 1, config.dim, generator=generator).to(dtype) for _ in range(3)]
    steps = [("text_decoder", (e, torch.tensor([i]))) for i, e in enumerate(embeds)]
    return NamedProgram(
        name,
        methods,
        inputs={"audio_encoder": (mel,), "token_embedding": (token,), "text_decoder": steps[0][1]},
        calls=[("audio_encoder", (mel,)), ("token_embedding", (token,)), *steps],
        doc=doc,
    )
