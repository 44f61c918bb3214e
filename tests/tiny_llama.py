"""Tiny random Llama models for the HF backend's tests (`from tiny_llama import tiny_llama`).

Built from a `LlamaConfig` on the CPU in float32 with a private RNG (the global torch seed is left as
it was), so a given `seed` gives bit-identical weights on every machine.
"""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(seed: int = 0, *, vocab_size: int = 256, hidden: int = 64, layers: int = 2, heads: int = 4,
               kv_heads: int = 2, intermediate: int = 128, max_position: int = 512,
               init_std: float = 0.1, attn_implementation: str = "sdpa") -> LlamaForCausalLM:
    """A random fp32 LlamaForCausalLM in eval mode.

    init_std: weight init std. transformers' default 0.02 gives near-uniform logits whose top two
        often differ by less than the k-token vs 1-token forward noise (a greedy near-tie at almost
        every step); 0.1 gives logits spread enough for exact greedy comparisons.
    Everything else maps 1:1 onto LlamaConfig (hidden_size, num_hidden_layers, num_attention_heads,
    num_key_value_heads, intermediate_size, max_position_embeddings); head_dim = hidden // heads.
    """
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_position, initializer_range=init_std, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=1, pad_token_id=None, attn_implementation=attn_implementation)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.to(torch.float32).eval()
