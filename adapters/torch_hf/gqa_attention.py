"""`attn_implementation="draftcore_sdpa"`: transformers' sdpa attention, except that a masked
multi-token query on a CPU reaches torch's SDPA with the key/value heads grouped (`enable_gqa`)
instead of copied.

transformers' `sdpa_attention_forward` passes `enable_gqa=True` only when there is no attention mask;
with one (a draft tree's) it first expands K and V of the whole cache to every query head
(`repeat_kv`: a copy per layer, per verify, that grows with the context). On SmolLM2-135M (9 query
heads over 3 KV heads, fp32, 2 CPU cores; `python benchmarks/hf_verify_cost.py`, median ms of a
verify) that copy made a 2-node tree cost 27.5 ms against one node's 24.8 at 200 tokens of context,
32.8 against 27.9 at 1,000; grouped, 26.0 and 29.5.

Everything else goes to transformers' own function unchanged: a one-token decode, a prefill
without a mask, a model without grouped heads, and any GPU (there torch's masked grouped SDPA falls
back to its math kernel, which is why transformers gates it). Registering the name adds an entry to
transformers' attention registry (`AttentionInterface`, its extension point for this) and changes
nothing of "sdpa"; a model uses it only when loaded with it (`load_smollm2` does by default):

    AutoModelForCausalLM.from_pretrained(path, attn_implementation="draftcore_sdpa")
    load_smollm2(attn_implementation="draftcore_sdpa")
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "draftcore_sdpa"


def grouped_sdpa_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                   scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers' attention-function signature: (attn_output [batch, q_len, heads, dim], None)."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (attention_mask is None or query.shape[2] == 1 or groups == 1 or query.device.type != "cpu"
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or kwargs.get("output_attentions", False)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    # No is_causal here: this path runs only under a mask, where transformers' sdpa sets it False too.
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True)
    return output.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make NAME a valid attn_implementation (idempotent): the function above, sdpa's mask format."""
    AttentionInterface.register(NAME, grouped_sdpa_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
