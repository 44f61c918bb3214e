"""Whether a llama.cpp context's multi-token forwards compute what one-token decoding computes.

draftcore's greedy output equals plain decoding's token for token only where a verify of several
tokens gives the same logits as one token at a time. On llama.cpp that depends on the weight type
and the settings (README.md, "Quantized weights and exactness"). The construction self-check
measures the difference on its 5-node tree (`LlamaCppVerifier.self_check_error`); a context whose
difference can flip more than a rare near-tie gets an InexactBatchWarning naming what to change.

Largest |logit| difference between a chain of k tokens decoded in one batch and the same tokens
decoded one at a time (SmolLM2-135M, CPU, flash attention on, 1 thread, 60-token context;
llama-cpp-python 0.3.36; Q4_0, Q8_0 and Q4_K_M made with llama.cpp's quantizer):

    weights                         k = 2 .. 63                      k = 64
    Q4_0, Q4_1, Q8_0                0                                0.8 - 1.1
    Q4_K_M (repacked, the default)  0 up to k = 3, then 0.78 - 1.36  not measured
    Q4_K_M, use_extra_bufts=False   0 up to k = 5, then 0.82 - 1.24  not measured
    F16                             0.016 - 0.056                    0.047
    F32                             0.005 - 0.017                    0.040

So the self-check sees repacked Q4_K_M (0.039 relative) and flash attention off on any quantized
type (0.010 - 0.058), but not Q4_K_M without repacking, whose kernels change only from 6 tokens
(exact up to 5).
On 20 HumanEval prompts (128 new tokens, 2 threads) repacked Q4_K_M made 9 of 20 of draftcore's
outputs, and 17 of 20 of llama-cpp-python's own prompt lookup, differ from plain greedy.

Past 256 tokens of context there is a second difference, from the attention, not the weights. For
ONE query over a KV view of at least 512 cells, llama.cpp's CPU flash attention (ggml-cpu ops.cpp,
llama-cpp-python 0.3.36) splits the view into one piece per thread and merges the pieces' partial
softmax sums; a batch of several queries computes each row over the whole view. It does so only for
an F16 or F32 cache, and the view is the used cells rounded up to 256: from 257 cached tokens on, with
more than one thread, a verify's logits differ from one-token decoding's. Measured (SmolLM2 Q4_1, flash
attention on, a 4-token chain after a 300-token context): 0.95 (3.3 % of the largest logit) with an F16
cache and 2 threads; 0 with one thread, and 0 with a Q8_0 cache at 2 threads; 0 everywhere after a
200-token context. On 6 agent prompts of 366-401 tokens (128 new tokens, 2 threads) draftcore's trie
output equalled plain greedy on 0 of 6 with an F16 cache, on 6 of 6 with a Q8_0 cache or one thread.
The self-check's context is too short to see it, and a check long enough would prefill 257 tokens at
every construction (seconds for a 7B model on a CPU): `split_attention_from` names the case from the
context's settings, and tests/test_llamacpp_long_context.py measures it on the installed llama.cpp.

Why the cap is not found by probing each tree size at construction (measured 2026-11-26: chains,
two-branch trees and stars of 2-9 nodes, and chains of 2-63, against one-token decoding, 2 threads):
- With flash attention off, exactness follows the tokens and positions, not the size: on Q4_1 a
  3-token chain was off by 0.023 relative in one draw while chains of up to 6 were exact in another.
  No size can be promised exact; the advice stays flash_attn=True.
- Repacked Q4_K_M is exact for chains of up to 3 tokens, but a 3-node tree with two leaves is off by
  0.026: the largest exact tree has 2 nodes, one drafted token, too few to pay for the check.
- Probing every size up to 63 took 4-8 s on SmolLM2, and would take minutes for a 7B model on a CPU.
"""
from __future__ import annotations

import sys
import warnings

# Above this relative difference a context is warned about. Float weights stay below it (F32 4e-4,
# F16 2e-3: differences of hundredths of a logit; F32 flipped no greedy token in 20 prompts);
# quantized weights with flash attention off (0.010-0.058) or repacked K-quants (0.039) exceed it.
NEAR_TIE_ONLY = 0.005


# On a CPU every weight type measured (table above) computes a batch of 64 or more tokens with other
# kernels than a smaller one, while its cost has long passed what drafting can pay (a 32-token verify
# costs 5-16 one-token ones there): trees stay within this many nodes unless a verifier is told otherwise.
CPU_TREE_NODES = 63


def default_max_tree_nodes(n_batch: int, offloaded: bool) -> int:
    """The most nodes a verify takes when the caller set no max_tree_nodes: n_batch (one llama_decode
    holds the tree), capped at CPU_TREE_NODES where no layer is offloaded to a GPU."""
    return n_batch if offloaded else min(n_batch, CPU_TREE_NODES)


# ggml's CPU flash attention splits one query's KV view across threads from this many cells of view
# (ops.cpp, use_split_kv_path), and llama.cpp rounds the view up to a multiple of 256 cells.
SPLIT_KV_VIEW = 512
KV_VIEW_PADDING = 256


def split_attention_from(lib, params, *, n_ctx: int, n_threads: int, offloaded: bool) -> int | None:
    """The context length (cached tokens) from which one-token decoding on a context with these
    llama_context_params (`n_ctx` cells and `n_threads` decoding threads, as created) computes its
    attention in per-thread pieces while a batch does not (module docstring), or None where it never
    does: no layer offloaded (GPU kernels were not measured), flash attention on or automatic (on for
    a CPU), an F16 or F32 K and V cache, more than one thread, and room for a view of SPLIT_KV_VIEW
    cells."""
    if offloaded or n_threads <= 1 or params.flash_attn_type == lib.LLAMA_FLASH_ATTN_TYPE_DISABLED:
        return None
    split_types = (lib.GGML_TYPE_F16, lib.GGML_TYPE_F32)
    if params.type_k not in split_types or params.type_v != params.type_k or n_ctx < SPLIT_KV_VIEW:
        return None
    return SPLIT_KV_VIEW - KV_VIEW_PADDING + 1


def check_split_attention(lib, ctx, params, *, offloaded: bool, who: str) -> int | None:
    """split_attention_from for the created context `ctx` (its n_ctx and decoding threads, as
    llama.cpp read them back) with `params`; warns (InexactBatchWarning, naming `who` and the two
    settings that make batches exact past it) where it is not None, and returns it."""
    n_threads = int(lib.llama_n_threads(ctx))
    from_tokens = split_attention_from(lib, params, n_ctx=int(lib.llama_n_ctx(ctx)), n_threads=n_threads,
                                       offloaded=offloaded)
    if from_tokens is None:
        return None
    warnings.warn(
        f"{who}: with flash attention, an F16/F32 KV cache and n_threads={n_threads}, llama.cpp computes "
        f"one token's attention over a context of {from_tokens} tokens or more in pieces, one per thread, "
        f"and a batch's row by row: from there a verify's logits differ from one-token decoding's (by up "
        f"to 3% of the largest logit on SmolLM2), and greedy output drifts from plain decoding on most "
        f"long prompts, as llama.cpp's own speculative decoding does (and plain decoding's own output "
        f"there changes with the thread count). For bit-identical output use a "
        f"quantized KV cache (type_k=type_v=llama_cpp.GGML_TYPE_Q8_0, in your Llama too) or n_threads=1 "
        f"(docs/llamacpp.md, 'Quantized weights and exactness')", InexactBatchWarning,
        stacklevel=caller_stacklevel())
    return from_tokens


class InexactBatchWarning(UserWarning):
    """A llama.cpp context's multi-token forwards give other logits than one-token decoding: greedy
    output can differ from plain decoding wherever the top two logits are about that close."""


def is_float_weights(lib, ftype: int) -> bool:
    """Whether a GGUF file type (llama_model_ftype) is F32, F16 or BF16 weights."""
    floats = (lib.LLAMA_FTYPE_ALL_F32, lib.LLAMA_FTYPE_MOSTLY_F16, lib.LLAMA_FTYPE_MOSTLY_BF16)
    return ftype & ~lib.LLAMA_FTYPE_GUESSED in floats


def warn_if_inexact(lib, error: float, *, ftype: int, flash_attn_type: int, who: str = "LlamaCppVerifier",
                    batch_limit: str = f"keep trees within max_tree_nodes={CPU_TREE_NODES}") -> None:
    """InexactBatchWarning when the self-check's relative `error` exceeds NEAR_TIE_ONLY, naming what
    to change: flash attention where it is off, else the weight type. `who`: the object warning;
    `batch_limit`: how its user keeps batches within CPU_TREE_NODES tokens."""
    if error <= NEAR_TIE_ONLY:
        return
    if flash_attn_type == lib.LLAMA_FLASH_ATTN_TYPE_DISABLED:
        advice = ("Flash attention is off: turn it on (flash_attn=True, in your Llama too); llama.cpp's "
                  "CPU flash-attention kernel computes each row of a batch as it computes one token.")
    elif not is_float_weights(lib, ftype):
        advice = ("These quantized weights take other kernels in a batch than for one token (SmolLM2's "
                  "Q4_K_M from 4 tokens). On a CPU, Q4_0, Q4_1 and Q8_0 weights give bit-identical "
                  f"batches of up to {CPU_TREE_NODES} tokens with flash attention on ({batch_limit}).")
    else:
        advice = "F32 weights keep the difference to hundredths of a logit."
    warnings.warn(
        f"{who}: this context's multi-token forwards differ from one-token decoding by "
        f"{error:.3g} of the largest logit (the construction self-check). Greedy output then differs "
        f"from plain decoding wherever the top two logits are about that close, as llama.cpp's own "
        f"speculative decoding does on this context. {advice} (docs/llamacpp.md, "
        f"'Quantized weights and exactness')", InexactBatchWarning, stacklevel=caller_stacklevel())


# Frames of these modules are llama-cpp-python's and this adapter's own: a warning skips them, so that
# it points at the user's line (a from_gguf, a Llama(...) or its create_completion) however deep the
# call that found the problem (a draft model runs inside Llama.generate).
_INTERNAL_MODULES = ("llama_cpp", __name__.rpartition(".")[0])


def caller_stacklevel() -> int:
    """The `stacklevel` of warnings.warn, called by this function's caller, that names the first
    frame outside llama_cpp and this package."""
    frame, level = sys._getframe(1), 1   # the caller, which calls warnings.warn, is stacklevel 1
    while frame is not None and _is_internal(frame.f_globals.get("__name__", "")):
        frame, level = frame.f_back, level + 1
    return level


def _is_internal(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in _INTERNAL_MODULES)
