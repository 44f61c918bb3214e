"""Test fixture: write an HF Llama model to a float32 GGUF file that llama.cpp loads.

The same weights run in HF (fp32) and in llama.cpp (F32 tensors, f32 KV cache), so any difference
in their greedy tokens is a bug, not quantization. No external converter script: the tensor renaming
and the one real transformation (the rotary q/k permutation below) are done here. Used by the
llama.cpp tests and by benchmarks/llamacpp_q41_divergence.py (SmolLM2 dequantized to F32); not part
of draftcore's API.

    HF name                                     GGUF name                     change
    model.embed_tokens.weight                   token_embd.weight
    model.layers.{i}.input_layernorm.weight     blk.{i}.attn_norm.weight
    model.layers.{i}.self_attn.q_proj.weight    blk.{i}.attn_q.weight         permute(n_head)
    model.layers.{i}.self_attn.k_proj.weight    blk.{i}.attn_k.weight         permute(n_head_kv)
    model.layers.{i}.self_attn.v_proj.weight    blk.{i}.attn_v.weight
    model.layers.{i}.self_attn.o_proj.weight    blk.{i}.attn_output.weight
    model.layers.{i}.post_attention_layernorm   blk.{i}.ffn_norm.weight
    model.layers.{i}.mlp.{gate,up,down}_proj    blk.{i}.ffn_{gate,up,down}.weight
    model.norm.weight                           output_norm.weight
    lm_head.weight                              output.weight                 omitted when tied

Imports gguf and numpy only; torch is needed only to read the HF model handed in.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from draftcore.errors import ConfigError

# Token types of llama.cpp's vocabulary (gguf.TokenType), spelled out so the fallback vocab reads plainly.
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6
_N_SPECIAL = 3 + 256  # <unk> <s> </s> and the 256 byte tokens an SPM vocab must carry


def permute_qk(weight: np.ndarray, n_head: int) -> np.ndarray:
    """HF -> GGUF rotary layout for one q or k projection (`LlamaModel.permute` in convert_hf_to_gguf).

    HF rotates pairs (x[j], x[j + d/2]) of each head ("rotate_half"); llama.cpp's normal rope rotates
    adjacent pairs (x[2j], x[2j + 1]). Reordering the output rows of W_q / W_k per head makes both
    compute the same attention scores. For k, n_head is the number of KV heads.
    """
    out_dim = weight.shape[0]
    return (weight.reshape(n_head, 2, out_dim // n_head // 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape))


def write_llama_gguf(model, path, *, tokenizer_from=None, name: str = "draftcore-llama") -> Path:
    """Write an HF `LlamaForCausalLM` (any dtype; written as float32) to a GGUF file at `path`.

    tokenizer_from: an existing GGUF file (e.g. the Q4_1 SmolLM2 one) whose `tokenizer.*` metadata is
        copied, so llama.cpp's encode/decode match the original model; its vocabulary size must equal
        the model's. When None, a dummy SPM vocabulary of the right size is written (<unk>, <s>, </s>,
        256 byte tokens, then "tok<i>"): token ids are all the exactness tests need.
    Returns the path written.
    """
    import gguf

    cfg = model.config
    _check_supported(cfg)
    n_head, n_head_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_head
    path = Path(path)

    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(_rope_theta(cfg))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    if tokenizer_from is None:
        _add_dummy_spm_vocab(writer, cfg.vocab_size)
    else:
        _copy_tokenizer(writer, tokenizer_from, cfg.vocab_size)

    for gguf_name, weight in _gguf_tensors(model.state_dict(), cfg, n_head, n_head_kv):
        writer.add_tensor(gguf_name, np.ascontiguousarray(weight, dtype=np.float32))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_llama_gguf(path, *, seed: int = 0, vocab_size: int = 512, **options):
    """Write `tiny_llama(seed, vocab_size=vocab_size, **options)` (tests/tiny_llama.py: the same tiny
    random Llama the HF tests use) to `path` with the dummy SPM vocabulary.

    Returns the HF model (eval mode) so a test holds the very same weights on both backends.
    """
    from tiny_llama import tiny_llama

    if vocab_size < _N_SPECIAL + 1:
        raise ConfigError(f"vocab_size: expected >= {_N_SPECIAL + 1} (specials + 256 byte tokens), "
                          f"got {vocab_size}")
    model = tiny_llama(seed, vocab_size=vocab_size, **options)
    write_llama_gguf(model, path, name="draftcore-tiny-llama")
    return model


def _check_supported(cfg) -> None:
    if getattr(cfg, "model_type", "llama") != "llama":
        raise ConfigError(f"model.config.model_type: expected 'llama', got {cfg.model_type!r}")
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        raise ConfigError("model.config: attention_bias/mlp_bias are not written by this converter; "
                          "expected both False")
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(f"model.config rope_type: only 'default' rope is written, got {rope_type!r}")
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise ConfigError(f"model.config.hidden_act: expected 'silu', got {cfg.hidden_act!r}")


def _rope_theta(cfg) -> float:
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", None))
    if theta is None:
        raise ConfigError("model.config: no rope_theta in rope_parameters or on the config")
    return float(theta)


def _gguf_tensors(state, cfg, n_head, n_head_kv):
    """Yield (gguf name, float32 numpy array) in llama.cpp's order."""
    def get(name):
        return state[name].detach().to("cpu").float().numpy()

    yield "token_embd.weight", get("model.embed_tokens.weight")
    for i in range(cfg.num_hidden_layers):
        hf, blk = f"model.layers.{i}.", f"blk.{i}."
        yield blk + "attn_norm.weight", get(hf + "input_layernorm.weight")
        yield blk + "attn_q.weight", permute_qk(get(hf + "self_attn.q_proj.weight"), n_head)
        yield blk + "attn_k.weight", permute_qk(get(hf + "self_attn.k_proj.weight"), n_head_kv)
        yield blk + "attn_v.weight", get(hf + "self_attn.v_proj.weight")
        yield blk + "attn_output.weight", get(hf + "self_attn.o_proj.weight")
        yield blk + "ffn_norm.weight", get(hf + "post_attention_layernorm.weight")
        yield blk + "ffn_gate.weight", get(hf + "mlp.gate_proj.weight")
        yield blk + "ffn_up.weight", get(hf + "mlp.up_proj.weight")
        yield blk + "ffn_down.weight", get(hf + "mlp.down_proj.weight")
    yield "output_norm.weight", get("model.norm.weight")
    # Tied embeddings: llama.cpp falls back to token_embd when output.weight is absent.
    if not getattr(cfg, "tie_word_embeddings", False) and "lm_head.weight" in state:
        yield "output.weight", get("lm_head.weight")


def _add_dummy_spm_vocab(writer, vocab_size: int) -> None:
    """A minimal "llama" (SentencePiece) vocabulary llama.cpp accepts: specials, bytes, dummies."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [_UNKNOWN, _CONTROL, _CONTROL] + [_BYTE] * 256
    tokens += [f"tok{i}" for i in range(len(tokens), vocab_size)]
    types += [_NORMAL] * (vocab_size - len(types))
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * vocab_size)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)


def _copy_tokenizer(writer, source, vocab_size: int) -> None:
    """Copy every `tokenizer.*` key of the GGUF file `source` (tokens, merges, types, special ids)."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ConfigError(f"tokenizer_from: {source} has no tokenizer.ggml.tokens")
    if len(tokens.data) != vocab_size:
        raise ConfigError(f"tokenizer_from: {source} has {len(tokens.data)} tokens, "
                          f"the model's vocab_size is {vocab_size}")
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub_type = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type)
