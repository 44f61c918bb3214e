"""Logits processing for sampling, applied at every node of a draft tree to that node's own prefix.

Row i of a verify's float32[n, vocab] logits predicts the token after node i, so the penalties of
row i count the tokens of node i's prefix: the committed context (prompt + generated, ending with
the root) plus the drafted tokens on the path root → i (the root itself is already in the context):

    context ... a b | t              prefix(t) = context
                      ├── x          prefix(x) = context x
                      │   └── y      prefix(y) = context x y
                      └── y          prefix(y) = context y     (same token, other prefix, other row)

Order — transformers 5.x `GenerationMixin._get_logits_processor`: penalties first, then, only when
sampling, the warpers temperature → top-k → top-p → min-p. transformers has no presence/frequency
penalty; draftcore applies them right after the repetition penalty, with the semantics of the
OpenAI API and vLLM (counts over generated tokens only, the prompt excluded).

    parameter           transformers class                 effect on a row z (p = softmax(z))
    repetition_penalty  RepetitionPenaltyLogitsProcessor   z[t] = z[t] / θ if z[t] >= 0 else z[t] · θ, once for
                                                           each distinct t in prompt + generated + path
    presence_penalty    —  (OpenAI / vLLM)                 z[t] -= presence     if c[t] > 0   c[t]: count of t in
    frequency_penalty   —  (OpenAI / vLLM)                 z[t] -= frequency · c[t]           generated + path
    temperature         TemperatureLogitsWarper            z /= T
    top_k               TopKLogitsWarper                   z[t] = -inf where z[t] < the k-th largest (ties kept)
    top_p               TopPLogitsWarper                   keep the most likely tokens, in order, while the
                                                           mass before each is < top_p (the first always kept)
    min_p               MinPLogitsWarper                   z[t] = -inf where p[t] < min_p · max(p)

Greedy decoding (temperature 0) applies the penalties only, then takes the argmax, as transformers
does with do_sample=False. Arithmetic is float32 like transformers' except top-p's cumulative mass
(float64 here, float32 there): the kept set can differ only when the mass sits within ~1e-7 of top_p.
Ties at the top-p boundary keep the lower token id first (torch.sort gives no order for ties).
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .errors import BackendError, describe


class LogitsProcessor:
    """Per-request logits processing (see the module docstring for the order and semantics).

    Follows a request like a drafter does: `start(prompt)`, then `update(tokens)` with every batch
    of accepted tokens; `process_next` processes the row after the context, `process_tree` the
    rows of a verified tree, each for its own prefix. Both return new float32 arrays (the input is
    not modified); `-inf` marks a filtered token.

        parameter           default  off when
        temperature         1.0      1.0        (0 is greedy: the caller takes the argmax; no warper)
        top_k               0        0
        top_p               1.0      1.0
        min_p               0.0      0.0
        repetition_penalty  1.0      1.0
        presence_penalty    0.0      0.0
        frequency_penalty   0.0      0.0

    Parameters are trusted here: `SamplingParams` validates them at the public boundary.
    """

    def __init__(self, vocab_size: int, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0, repetition_penalty: float = 1.0, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0):
        self.vocab_size = int(vocab_size)
        self.warp = temperature > 0.0
        self.temperature = float(temperature)
        self.top_k = int(top_k or 0)
        self.top_p = float(top_p)
        self.min_p = float(min_p or 0.0)
        self.repetition_penalty = float(repetition_penalty)
        self.presence_penalty = float(presence_penalty)
        self.frequency_penalty = float(frequency_penalty)
        self.penalised = (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                          or self.frequency_penalty != 0.0)
        # Request state: which tokens the context holds (repetition penalty) and how often each was
        # generated (presence / frequency); `_seen_ids[:_n_seen]` lists the seen ids sparsely.
        self._seen = np.zeros(self.vocab_size, np.bool_)
        self._counts = np.zeros(self.vocab_size, np.int32)
        self._seen_ids = np.empty(64, np.int32)
        self._n_seen = 0

    @classmethod
    def from_params(cls, params, vocab_size: int) -> "LogitsProcessor":
        """From a `draftcore.SamplingParams` (greedy params keep their penalties only)."""
        return cls(vocab_size, temperature=params.temperature if not params.is_greedy else 0.0,
                   top_k=params.top_k, top_p=params.top_p, min_p=params.min_p,
                   repetition_penalty=params.repetition_penalty, presence_penalty=params.presence_penalty,
                   frequency_penalty=params.frequency_penalty)

    # -- request state ---------------------------------------------------------------------------
    def start(self, prompt: np.ndarray) -> None:
        """A new request: the prompt's tokens count for the repetition penalty only."""
        self._seen[:] = False
        self._counts[:] = 0
        self._n_seen = 0
        self._add(prompt, generated=False)

    def update(self, tokens: np.ndarray) -> None:
        """`tokens` (int32[k]) were generated and appended to the context."""
        self._add(tokens, generated=True)

    def _add(self, tokens, generated: bool) -> None:
        if not self.penalised:
            return
        tokens = np.asarray(tokens, np.int32)
        if generated:
            np.add.at(self._counts, tokens, 1)
        new = np.unique(tokens[~self._seen[tokens]])
        if new.size:
            self._seen[new] = True
            need = self._n_seen + new.size
            if need > self._seen_ids.shape[0]:
                grown = np.empty(max(need, 2 * self._seen_ids.shape[0]), np.int32)
                grown[:self._n_seen] = self._seen_ids[:self._n_seen]
                self._seen_ids = grown
            self._seen_ids[self._n_seen:need] = new
            self._n_seen = need

    # -- processing ------------------------------------------------------------------------------
    def process_next(self, logits: np.ndarray) -> np.ndarray:
        """float32[vocab]: the processed row for the token after the context (prefill)."""
        root = np.zeros(1, np.int32)  # a root-only tree: its prefix is the context
        return self.process_tree(logits[None, :], root, np.full(1, -1, np.int32))[0]

    def process_tree(self, logits: np.ndarray, tokens: np.ndarray, parents: np.ndarray) -> np.ndarray:
        """float32[n, vocab]: row i processed for node i's prefix (context + drafted ancestors + i).

        logits: float32[n, vocab] from `verify(tree, "logits")`; tokens, parents: the tree's arrays.
        """
        z = np.array(logits, np.float32, copy=True, order="C")
        if self.penalised:
            _penalise(z, tokens, parents, self._seen, self._seen_ids, self._n_seen, self._counts,
                      np.float32(self.repetition_penalty), np.float32(self.presence_penalty),
                      np.float32(self.frequency_penalty))
        if not self.warp:
            return z
        if self.temperature != 1.0:
            z /= np.float32(self.temperature)
        if 0 < self.top_k < self.vocab_size:
            kth = np.partition(z, self.vocab_size - self.top_k, axis=1)[:, self.vocab_size - self.top_k]
            z[z < kth[:, None]] = -np.inf
        if self.top_p < 1.0:
            _top_p(z, self.top_p)
        if self.min_p > 0.0:
            with np.errstate(invalid="ignore"):
                relative = np.exp(z - z.max(axis=1, keepdims=True))  # p[t] / max(p)
            z[relative < np.float32(self.min_p)] = -np.inf
        return z


_WARM = []


def warm_up_kernels() -> None:
    """Compile (or load from numba's cache) the kernels once per process, outside any timed loop."""
    if _WARM:
        return
    from .acceptance import sample_accept
    z = np.zeros((2, 4), np.float32)
    tokens, parents = np.zeros(2, np.int32), np.array([-1, 0], np.int32)
    _penalise(z, tokens, parents, np.zeros(4, np.bool_), np.zeros(1, np.int32), 0, np.zeros(4, np.int32),
              np.float32(1.0), np.float32(0.0), np.float32(0.0))
    _top_p(z, 0.5)
    sample_accept(tokens, parents, softmax(z), np.zeros(2))
    _WARM.append(True)


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax of processed logits (float32, -inf → 0)."""
    z = np.asarray(z, np.float32)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    e /= e.sum(axis=-1, keepdims=True)
    return e


def checked_logits(out, shape: tuple, where: str) -> np.ndarray:
    """Validate a backend's logits: float array of `shape`, no NaN (-inf allowed)."""
    if not isinstance(out, np.ndarray) or out.shape != shape or not np.issubdtype(out.dtype, np.floating):
        raise BackendError(f"{where}: expected float32{list(shape)} logits, got {describe(out)}")
    top = out.max()  # one reduction: NaN and +inf both propagate to it
    if not top < np.inf:
        raise BackendError(f"{where}: logits contain NaN or +inf (max {top})")
    return out


@nb.njit(cache=True)
def _penalise(z, tokens, parents, seen, seen_ids, n_seen, counts, repetition, presence, frequency):
    """Repetition / presence / frequency penalties on z (float32[n, vocab]) in place, row i for the
    prefix context + tokens[path root → i] (root excluded: it is the context's last token).

    seen: bool[vocab], tokens in the context; seen_ids[:n_seen]: the same, listed; counts:
    int32[vocab], generated occurrences. Only tokens in the prefix are touched: O(n · (n_seen + depth)).
    """
    n = z.shape[0]
    extra = np.zeros(z.shape[1], np.int32)  # occurrences on node i's drafted path
    for i in range(n):
        j = i
        while j > 0:
            extra[tokens[j]] += 1
            j = parents[j]
        for s in range(n_seen):
            t = seen_ids[s]
            z[i, t] = _penalty(z[i, t], counts[t] + extra[t], repetition, presence, frequency)
        j = i
        while j > 0:  # drafted tokens the context lacks: penalise once, clearing `extra` as we go
            t = tokens[j]
            if extra[t] > 0:
                if not seen[t]:
                    z[i, t] = _penalty(z[i, t], extra[t], repetition, presence, frequency)
                extra[t] = 0
            j = parents[j]


@nb.njit(cache=True, inline="always")
def _penalty(x, count, repetition, presence, frequency):
    """One token's penalties in float32, as torch computes them (parameters are float32 scalars)."""
    x = x * repetition if x < 0 else x / repetition
    if count > 0:
        x = x - frequency * np.float32(count)
        x = x - presence
    return x


@nb.njit(cache=True)
def _top_p(z, top_p):
    """Nucleus filter on z (float32[n, vocab]) in place: in descending probability, keep a token
    while the mass before it is < top_p (transformers: remove where the ascending cumulative mass
    is <= 1 - top_p; always keep the most likely token).

    Only the head of each row is sorted: candidates are the tokens with p >= thr · max(p); when
    their mass reaches top_p, every kept token is among them (the kept set is a top-m set and the
    candidates are a top-c set with c >= m). thr shrinks until that holds (at worst: all tokens).
    """
    n, vocab = z.shape
    q = np.empty(vocab, np.float64)
    cand = np.empty(vocab, np.int64)
    keep = np.zeros(vocab, np.bool_)
    for i in range(n):
        m = -np.inf
        for v in range(vocab):
            if z[i, v] > m:
                m = z[i, v]
        if m == -np.inf:
            continue
        total = 0.0
        for v in range(vocab):
            e = np.exp(np.float64(z[i, v]) - m)
            q[v] = e
            total += e
        need = top_p * total
        thr = 1.0 / 16.0
        while True:
            n_cand = 0
            mass = 0.0
            for v in range(vocab):
                if (q[v] >= thr and q[v] > 0.0) or thr == 0.0:
                    cand[n_cand] = v
                    n_cand += 1
                    mass += q[v]
            if mass >= need or thr == 0.0:
                break
            thr = thr / 256.0 if thr > 1e-60 else 0.0
        heads = cand[:n_cand]
        order = np.argsort(-q[heads], kind="mergesort")  # descending p; ties: lower id first
        before = 0.0
        for j in range(n_cand):
            if j > 0 and before >= need:
                break
            v = heads[order[j]]
            keep[v] = True
            before += q[v]
        for v in range(vocab):
            if keep[v]:
                keep[v] = False
            else:
                z[i, v] = -np.inf
