"""What llama-cpp-python's `logits_all` costs a prompt: measured, for the warning a Llama built by
hand with a draft model gets.

A `Llama(draft_model=...)` keeps every position's logits (`logits_all`): llama.cpp computes the
output head for every token of a batch, not the last only, and `Llama.eval` copies each row into
numpy. The head's share of a forward grows with the vocabulary: a 262k-token vocabulary over a small
model makes the head most of the work, so a prompt's evaluation takes several times as long as
plain decoding's, before any draft could pay for it. No draft model can avoid that cost (it is paid
before the first call), so `DraftcoreDraftModel` measures it once and warns, pointing to
`speculative_llama` (a `SpeculativeLlama` asks llama.cpp for the logits rows it samples only, and is
never measured) and to `LlamaCppVerifier` for trees.

The measurement: one batch of PROMPT_TOKENS random tokens, decoded with the last row of logits and
with every row (copied to numpy as `Llama.eval` does), alternately, median of REPS each after one
warm-up of each, on a small context of its own over the Llama's loaded weights and settings
(the Llama's KV cache is not touched).
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from draftcore.errors import BackendError

from .context import new_context, tree_context_params
from .numerics import caller_stacklevel

PROMPT_TOKENS = 32
REPS = 3
# Above this slowdown of a prompt's evaluation the drop-in warns. A request stays at 0.95x of plain
# decoding only while (prompt share of its time) x (slowdown - 1) <= 5%: at 1.5x, a prompt taking a
# tenth of the request already costs that. SmolLM2-135M Q4_1 (49k vocabulary) measures 1.14x on the
# 2-core CPU; a tiny Llama with a 262k vocabulary 6.8x (docs/llamacpp.md).
SLOWDOWN_WARNED = 1.5


class AllLogitsCostWarning(UserWarning):
    """A Llama with a draft model evaluates prompts much slower than without one (logits_all)."""


def all_logits_slowdown(lib, llm, tokens: int = PROMPT_TOKENS, reps: int = REPS) -> float:
    """Seconds of a `tokens`-token prompt batch with every row's logits computed and copied, over
    the seconds with the last row's only, for `llm` (a llama_cpp.Llama) on this machine."""
    params = tree_context_params(lib, llm.context_params, n_ctx=max(2 * tokens, 64), n_batch=tokens, n_seq_max=1)
    ctx = new_context(lib, llm.model, params)
    try:
        vocab = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(llm.model)))
        ids = np.random.default_rng(0).integers(0, vocab, tokens).astype(np.int32)
        batch = lib.llama_batch_init(tokens, 0, 1)
        try:
            seconds = {"last": [], "all": []}
            for rep in range(reps + 1):
                for mode in ("last", "all"):
                    start = time.perf_counter()
                    _decode(lib, ctx, batch, ids, every_row=mode == "all", vocab=vocab)
                    if rep:
                        seconds[mode].append(time.perf_counter() - start)
        finally:
            lib.llama_batch_free(batch)
    finally:
        lib.llama_free(ctx)
    return float(np.median(seconds["all"]) / np.median(seconds["last"]))


def _decode(lib, ctx, batch, ids: np.ndarray, every_row: bool, vocab: int) -> None:
    """Decode `ids` at positions 0.. in sequence 0 of an emptied cache; copy the logits asked for."""
    lib.llama_memory_clear(lib.llama_get_memory(ctx), True)
    n = ids.shape[0]
    batch.n_tokens = n
    for i, token in enumerate(ids):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = int(token), i, 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = every_row or i == n - 1
    rc = lib.llama_decode(ctx, batch)
    if rc != 0:
        raise BackendError(f"llama_decode returned {rc} measuring the cost of logits_all")
    rows = n if every_row else 1
    first = 0 if every_row else n - 1
    logits = np.ctypeslib.as_array(lib.llama_get_logits_ith(ctx, first), shape=(rows * vocab,))
    np.array(logits)   # the copy Llama.eval makes of each row


def warn_if_slow(slowdown: float, vocab: int) -> None:
    """AllLogitsCostWarning where a prompt's evaluation with logits_all is past SLOWDOWN_WARNED."""
    if slowdown <= SLOWDOWN_WARNED:
        return
    warnings.warn(AllLogitsCostWarning(
        f"DraftcoreDraftModel: with a draft model attached to a Llama built by hand, llama-cpp-python computes "
        f"and copies every position's logits (logits_all); with this model's {vocab:,}-token vocabulary that "
        f"makes a prompt's evaluation {slowdown:.1f}x as slow as plain decoding's (measured here), which "
        f"drafting cannot win back on short answers. Build it with "
        f"draftcore.adapters.llamacpp.speculative_llama(model_path, ...) instead: the same llama_cpp.Llama, "
        f"computing only the logits rows it samples (for draft trees: "
        f"draftcore.speculate(LlamaCppVerifier.from_llama(llm), prompt))."), stacklevel=caller_stacklevel())
