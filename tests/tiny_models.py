"""Tiny random-weight models built from transformers configs (the hub is out of reach), for tests
of anything that walks a real architecture: Llama, Qwen2, Mistral, Gemma, Mixtral, and the
architectures people run today (``RECENT_ARCHS``): Gemma 2 and Gemma 3 text (sliding-window and
global layers, head_dim 256, one KV head for 2 query heads, soft-capping in Gemma 2), Qwen3 and Qwen3-MoE (a dense
layer among the MoE ones), Phi-3 (fused projections), Llama 3.x rope scaling, OLMo 2."""

from __future__ import annotations

import torch

TINY_ARCHS = ("llama", "qwen2", "mistral", "gemma", "mixtral")
RECENT_ARCHS = ("gemma2", "gemma3_text", "qwen3", "qwen3_moe", "phi3", "llama3", "olmo2")
OFFSET_NORMS = ("gemma", "gemma2", "gemma3_text")  # norms scale by 1 + w
_NO_SPECIAL_TOKENS = dict(pad_token_id=None, bos_token_id=None, eos_token_id=None)  # defaults lie outside vocab 128
_GEMMA_NEW = dict(num_key_value_heads=1, head_dim=256, sliding_window=8)
_LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=64, rope_theta=500000.0)


def tiny_config(arch: str, **over):
    import transformers as tf

    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    classes = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "mistral": tf.MistralConfig,
               "gemma": tf.GemmaConfig, "mixtral": tf.MixtralConfig, "gemma2": tf.Gemma2Config,
               "gemma3_text": tf.Gemma3TextConfig, "qwen3": tf.Qwen3Config, "qwen3_moe": tf.Qwen3MoeConfig,
               "phi3": tf.Phi3Config, "llama3": tf.LlamaConfig, "olmo2": tf.Olmo2Config}
    if arch not in classes:
        raise ValueError(f"unknown tiny architecture {arch!r}; known: {TINY_ARCHS + RECENT_ARCHS}")
    extra = {"gemma": dict(head_dim=24), "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
             "mistral": dict(sliding_window=None),
             "gemma2": dict(_GEMMA_NEW, num_attention_heads=2, query_pre_attn_scalar=256),
             "gemma3_text": dict(_GEMMA_NEW, num_attention_heads=2, layer_types=["sliding_attention", "full_attention"]),
             "qwen3": dict(num_attention_heads=6, head_dim=16),
             "qwen3_moe": dict(num_attention_heads=6, head_dim=16, num_experts=4, num_experts_per_tok=2,
                               moe_intermediate_size=64, mlp_only_layers=[1]),
             "phi3": _NO_SPECIAL_TOKENS, "olmo2": _NO_SPECIAL_TOKENS,
             "llama3": dict(rope_parameters=_LLAMA3_ROPE)}.get(arch, {})
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
                if arch in OFFSET_NORMS:
                    p.normal_(0.0, 0.1)
                else:
                    p.normal_(1.0, 0.1)
                if not name.endswith(("q_norm.weight", "k_norm.weight")):  # per-head q/k norms stay tame
                    p[:3] *= 8.0  # outlier channels in every hidden norm's output
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
