"""How a prefill reuses the cached KV of a prompt's shared prefix: how much it keeps, and in what
chunks it runs the rest.

Keeping K cached tokens saves the Linear work of K rows, but what follows them costs attention of
its own. A fresh prefill of T tokens runs the causal attention kernel: T (T + 1) / 2 (query, key)
pairs. The rest R = T - K behind kept positions runs under an explicit mask, which computes every
pair, masked or not: in one forward R * T pairs, more than a fresh prefill's once R > K. Chunks of
the rest, each behind everything before it, take fewer pairs, but every forward streams all the
weights once more.

So the plan is priced in rows of Linear work, the unit a prompt token costs:

    cost = rows run + pairs / pairs_per_row + FORWARD_ROWS per forward

and the cheapest of a fresh prefill and the rest in 1, 2, 3, ... even chunks runs. `pairs_per_row`
comes from the model's shapes (`attention_pairs_per_row`): a row's Linear FLOPs over a pair's
attention FLOPs, 3,072 for SmolLM2-135M. Timed on SmolLM2, HF float32, fifth 2-core AVX-512 EPYC,
the fastest of 3 (`benchmarks/prefill_reuse.py --splits ...`,
docs/results/prefill-plans_hf_cpu-avx512_2026-12-04.json), ms:

    kept / prompt   fresh   one forward   2 chunks   3 chunks   4 chunks   picked
    35 / 250        375     338           492        576        665        one forward
    109 / 224       425     277           331        421        464        one forward
    100 / 500       892     614           659        737        1,007      one forward
    323 / 783       1,386   773           1,006      1,081      1,195      one forward
    150 / 1,000     1,810   1,759         1,428      1,467      1,543      one forward
    60 / 1,500      2,803   3,246         2,700      2,773      2,651      fresh

The price errs toward fewer forwards: in the last two rows chunks were 5-19 % faster than the plan
picked. A least-squares fit of an earlier run's 30 timings to rows, pairs and forwards gave 2,910
pairs per row (the FLOPs say 3,072) and 39 rows per forward, where 64 are counted; a price learnt
from the verifier's own prefills would pick those chunks. (On an earlier machine a 3,000-token
prompt keeping 24 in one forward took 11.9 s against 8.5 fresh; it runs fresh.)

The rule it replaces kept the attention within a fresh prefill's whatever the rows saved, so a short
shared prefix (an edit's or an extraction's instructions, 39 and ~105 tokens of ~230) was never kept.
"""
from __future__ import annotations

import torch

from .head import decoder_of

FORWARD_ROWS = 64   # a forward's own cost in rows: it streams every weight once, however few rows it runs


def attention_pairs_per_row(model) -> float:
    """The (query, key) attention pairs that cost what one prompt token's Linear work costs in
    `model`, by FLOPs (module docstring): the Linear weights of one decoder layer (2 FLOPs each per
    row) over 2 * heads * head_dim (a pair's two products, QK and PV, 2 FLOPs per multiply-add, per
    query head). 0.0 where the shapes cannot be read: then only a rest no longer than its kept
    prefix is kept (`reuse_plan`)."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    head_dim = getattr(config, "head_dim", None) or (hidden // heads if heads and hidden else None)
    layers = getattr(decoder_of(model) or model, "layers", None)
    if not heads or not head_dim or not layers:
        return 0.0
    weights = sum(module.weight.numel() for module in layers[0].modules() if isinstance(module, torch.nn.Linear))
    return weights / (2.0 * heads * head_dim) if weights else 0.0   # 2 * weights / (4 * heads * head_dim)


def plan_cost(keep: int, length: int, chunk: int, pairs_per_row: float) -> float:
    """A plan's price in rows of Linear work (module docstring; pairs_per_row > 0): a fresh prefill
    (keep 0) runs `length` rows in one causal forward; otherwise the rest runs in forwards of
    `chunk` rows, each attending to every position up to its end."""
    if keep == 0:
        rows, pairs, forwards = length, length * (length + 1) / 2, 1
    else:
        rows, forwards = length - keep, -(-(length - keep) // chunk)
        # Chunk i < forwards - 1 runs `chunk` rows against keep + (i + 1) * chunk positions; the
        # last runs what is left against all `length`. Summed in closed form, so pricing a plan does
        # not grow with the prompt (reuse_plan prices up to rest / FORWARD_ROWS of them).
        full = forwards - 1
        pairs = chunk * (full * keep + chunk * full * (full + 1) // 2) + (rows - full * chunk) * length
    return rows + pairs / pairs_per_row + FORWARD_ROWS * forwards


def reuse_plan(shared: int, length: int, pairs_per_row: float) -> tuple[int, int]:
    """(kept tokens, chunk size) for a prompt of `length` tokens sharing its first `shared` (at
    most length - 1) with the cache: the cheapest by `plan_cost` of a fresh prefill, (0, length),
    and the rest in the fewest even chunks of each count. With pairs_per_row 0 (shapes unknown),
    a rest no longer than the kept prefix runs in one forward (its attention is within a fresh
    prefill's and its rows fewer) and a longer one is not kept."""
    rest = length - shared
    if shared <= 0 or rest <= 0:
        return 0, length
    if pairs_per_row <= 0:
        return (shared, rest) if shared >= rest else (0, length)
    best, best_cost = (0, length), plan_cost(0, length, length, pairs_per_row)
    # Each further chunk saves at most rest^2 / 2 pairs and costs FORWARD_ROWS: past
    # rest / FORWARD_ROWS chunks (of ~FORWARD_ROWS rows) none can pay.
    for chunks in range(1, max(1, rest // FORWARD_ROWS) + 1):
        chunk = -(-rest // chunks)
        cost = plan_cost(shared, length, chunk, pairs_per_row)
        if cost < best_cost:
            best, best_cost = (shared, chunk), cost
    return best
