"""SDPA without cuDNN's attention, as a candidate a verifier measures against plain sdpa on CUDA.

On Hopper, torch's `scaled_dot_product_attention` may run a masked fp16/bf16 forward through cuDNN's
attention, which builds an execution plan for every new shape. A verify's shape changes at every
step (the context grows, the tree's size varies), so such a plan may be built for nearly every
verify. The GPU check on an H200 (docs/gpu.md) measured a bf16 tree verify at ~3x a plain step,
fp32 (which cuDNN's attention does not take) at one. Whether cuDNN is the cause was not established
there, so nothing is assumed: where cuDNN's attention could run, the verifier races its forwards
with and without it (fastest_forward.py) and keeps the faster per context length.

`without_cudnn(forward)` runs `forward` inside `torch.nn.attention.sdpa_kernel` with every other
backend allowed (the documented, thread-local way to restrict SDPA for the calls inside a block):
nothing of torch or transformers is modified, and other threads are unaffected.
"""
from __future__ import annotations

from functools import wraps

import torch

ATTENTION_WITH_SDPA = ("sdpa", "draftcore_sdpa")


def cudnn_attention_may_run(device: torch.device, dtype: torch.dtype, attn_implementation) -> bool:
    """True where sdpa could pick cuDNN's attention for this model: CUDA, fp16 or bf16, an sdpa
    attention, and cuDNN's SDPA backend enabled in this torch."""
    return (device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
            and attn_implementation in ATTENTION_WITH_SDPA and torch.backends.cuda.cudnn_sdp_enabled())


def without_cudnn(forward):
    """`forward` with SDPA restricted to its other backends (flash, memory-efficient, math)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    others = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

    @wraps(forward)
    def restricted(*args, **kwargs):
        with sdpa_kernel(others):
            return forward(*args, **kwargs)

    return restricted
