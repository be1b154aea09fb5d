"""Tiny random-weight models built from transformers configs (the hub is out of reach), for tests
of anything that walks a real architecture: Llama, Qwen2, Mistral, Gemma, Mixtral."""

from __future__ import annotations

import torch

TINY_ARCHS = ("llama", "qwen2", "mistral", "gemma", "mixtral")


def tiny_config(arch: str, **over):
    import transformers as tf

    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    classes = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "mistral": tf.MistralConfig,
               "gemma": tf.GemmaConfig, "mixtral": tf.MixtralConfig}
    if arch not in classes:
        raise ValueError(f"unknown tiny architecture {arch!r}; known: {TINY_ARCHS}")
    extra = {"gemma": dict(head_dim=24), "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
             "mistral": dict(sliding_window=None)}.get(arch, {})
    return classes[arch](**{**common, **extra, **over})


def tiny_model(arch: str = "llama", seed: int = 0, **over):
    """A random model in eval mode, float32; weights scaled like a trained model's (std 0.02)
    with a few strong activation-outlier channels so reordering has something to find."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **over), dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and p.dim() == 1:
                if arch == "gemma":
                    p.normal_(0.0, 0.1)
                else:
                    p.normal_(1.0, 0.1)
                p[:3] *= 8.0  # outlier channels in every norm output
    return model


def tiny_llama(vocab_size: int = 49152, layers: int = 2, hidden: int = 64, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(cfg).eval()
