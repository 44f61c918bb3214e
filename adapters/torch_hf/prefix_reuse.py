"""How a prefill reuses the cached KV of a prompt's shared prefix: how much it keeps, and in what
chunks it runs the rest.

A fresh prefill of T tokens runs the causal attention kernel, which skips the masked half: about
T^2 / 2 (query, key) pairs. The rest of a prompt behind kept positions runs under an explicit
causal mask (the kept keys plus the rest's own), and attention under a mask computes every pair,
masked or not. Run in one forward, the rest R = T - K behind K kept tokens takes R * T pairs: no
more than a fresh prefill's only while K >= R. Below that, one forward can cost more than no reuse
at all (SmolLM2-135M, 2-core EPYC: a 3,000-token prompt keeping 24 took 11.9 s against a fresh
8.5).

Run in m chunks of c tokens, each behind everything before it, the rest takes
R * K + R * (R + c) / 2 pairs, no more than a fresh prefill's (K + R)^2 / 2 while c <= K^2 / R.
So the rest runs in the fewest chunks that keep within that bound: the attention work is then at
most a fresh prefill's, and the Linear work (R rows instead of T) is less. Every forward also
streams all the weights once, so a chunk must keep enough rows to amortise that: a rest that would
need chunks under MIN_CHUNK tokens is not reused (a fresh prefill runs). A shared system prompt of
323 tokens with a rest of 460 (an agent's request behind its tool schema) then runs in 3 chunks of
154 instead of 783 tokens fresh.
"""
from __future__ import annotations

MIN_CHUNK = 64   # rows a chunk's forward needs to spend its time multiplying, not streaming weights


def reuse_plan(shared: int, length: int) -> tuple[int, int]:
    """(kept tokens, chunk size) for a prompt of `length` tokens sharing its first `shared` (at
    most length - 1) with the cache: (0, length) where reuse would cost more attention than a fresh
    prefill, or its chunks would be too small to pay."""
    rest = length - shared
    if shared <= 0 or rest <= 0:
        return 0, length
    if shared >= rest:
        return shared, rest
    bound = shared * shared // rest        # the largest chunk within a fresh prefill's attention
    chunks = -(-rest // bound) if bound else 0
    chunk = -(-rest // chunks) if chunks else 0   # <= bound: the fewest chunks, evened out
    if chunk < MIN_CHUNK:
        return 0, length
    return shared, chunk
