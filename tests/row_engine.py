"""A stand-in for a serving engine's batch, the way vLLM hands rows to its proposer.

Requests wait in a queue with a prompt and the continuation the "model" will produce. Each step, the
engine verifies every active row's draft against that continuation (accepting the drafted tokens
that match, plus the model's own next token, as a chain verifier does), retires finished requests,
condenses the batch (the last rows move into the holes, as vLLM's condense does), now and then swaps
two rows, and admits queued requests into free rows. A row is inactive at random (vLLM's empty
sampled_token_ids: a row that gets no draft this step) and then does not advance.
"""
from __future__ import annotations

import numpy as np


def repeating_requests(n, seed, vocab=40, prompt=(8, 40), output=(10, 60)):
    """(prompt, continuation) pairs whose text repeats itself, so drafts get accepted."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        block = rng.integers(0, vocab, int(rng.integers(2, 7)))
        text = np.tile(block, 40)
        noise = rng.random(text.shape[0]) < 0.08
        text[noise] = rng.integers(0, vocab, int(noise.sum()))
        n_prompt = int(rng.integers(*prompt))
        out.append((text[:n_prompt].astype(np.int32), text[n_prompt:n_prompt + int(rng.integers(*output))].astype(np.int32)))
    return out


class Engine:
    def __init__(self, requests, max_rows, max_len, seed=0, swap=0.2, inactive=0.1):
        self.queue = list(enumerate(requests))
        self.requests = dict(self.queue)
        self.max_rows, self.max_len = max_rows, max_len
        self.rng = np.random.default_rng(seed)
        self.swap, self.inactive = swap, inactive
        self.rows = np.zeros((max_rows, max_len), np.int32)
        self.ids: list = []          # request id in each batch row
        self.n_tokens: list = []     # tokens in each batch row
        self.made = {}               # request id -> tokens generated so far
        self.accepted = 0
        self.steps = 0
        self._admit()
        self.active = self._draw_active()

    @property
    def done(self) -> bool:
        return not self.ids and not self.queue

    def batch(self):
        """What propose() gets: (rows, n_tokens int32[n], active bool[n], ids)."""
        return self.rows, np.array(self.n_tokens, np.int32), self.active.copy(), list(self.ids)

    def step(self, drafts) -> None:
        """Verify drafts[r] (a list of token ids per batch row), then move the batch on."""
        self.steps += 1
        for r, q in enumerate(self.ids):
            if not self.active[r]:
                continue
            prompt, truth = self.requests[q]
            made = self.made[q]
            k = 0
            draft = drafts[r]
            while k < len(draft) and made + k < len(truth) and draft[k] == truth[made + k]:
                k += 1
            self.accepted += k
            new = truth[made:made + k + 1]
            self.rows[r, self.n_tokens[r]:self.n_tokens[r] + len(new)] = new
            self.n_tokens[r] += len(new)
            self.made[q] = made + len(new)
        keep = [r for r, q in enumerate(self.ids) if self.made[q] < len(self.requests[q][1])]
        self._condense(keep)
        if len(self.ids) > 1 and self.rng.random() < self.swap:
            a, b = self.rng.choice(len(self.ids), 2, replace=False)
            self._swap(int(a), int(b))
        self._admit()
        self.active = self._draw_active()

    def _condense(self, keep):
        """Rows not kept are holes; the last kept rows move into them (vLLM's condense)."""
        keep = set(keep)
        holes = [r for r in range(len(self.ids)) if r not in keep]
        tail = [r for r in range(len(self.ids) - 1, -1, -1) if r in keep]
        for hole in holes:
            if not tail or tail[0] < hole:
                break
            src = tail.pop(0)
            self._move(src, hole)
            keep.discard(src)
            keep.add(hole)
        n = len(keep)
        self.ids, self.n_tokens = self.ids[:n], self.n_tokens[:n]

    def _move(self, src, dst):
        self.rows[dst] = self.rows[src]
        self.ids[dst], self.n_tokens[dst] = self.ids[src], self.n_tokens[src]

    def _swap(self, a, b):
        self.rows[[a, b]] = self.rows[[b, a]]
        self.ids[a], self.ids[b] = self.ids[b], self.ids[a]
        self.n_tokens[a], self.n_tokens[b] = self.n_tokens[b], self.n_tokens[a]

    def _admit(self):
        while self.queue and len(self.ids) < self.max_rows:
            q, (prompt, truth) = self.queue.pop(0)
            r = len(self.ids)
            first = truth[:1]   # prefill samples the first token
            row = np.concatenate([prompt, first])
            self.rows[r, :row.shape[0]] = row
            self.rows[r, row.shape[0]:] = 7   # stale tokens past the end, as an engine leaves them
            self.ids.append(q)
            self.n_tokens.append(row.shape[0])
            self.made[q] = 1

    def _draw_active(self):
        return self.rng.random(len(self.ids)) >= self.inactive


def vllm_arguments(engine: Engine, seen: dict, max_seqs: int):
    """propose()'s arguments as vLLM passes them: (sampled_token_ids, num_tokens_no_spec int32[max_seqs],
    token_ids_cpu). sampled_token_ids[r] holds row r's tokens since the last call (what the step
    accepted and sampled; a new request's row: its first token; a row that did not advance: none).
    `seen` (request id -> tokens at the last call) is updated."""
    rows, n_tokens, _, ids = engine.batch()
    sampled = [rows[r, seen.get(q, n_tokens[r] - 1):n_tokens[r]].tolist() for r, q in enumerate(ids)]
    seen.clear()
    seen.update(zip(ids, n_tokens.tolist()))
    counts = np.zeros(max_seqs, np.int32)
    counts[:len(n_tokens)] = n_tokens
    return sampled, counts, rows
