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
    logits_processors   a user's LogitsProcessor list      z = fn(prefix, z) for each fn in order, prefix =
                                                           prompt + generated + path (int64)
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

from .errors import BackendError, InputError, describe



class LogitsProcessor:
    """Per-request logits processing (see the module docstring for the order and semantics).

    Follows a request like a drafter does: `start(prompt)`, then `update(tokens)` with every batch
    of accepted tokens; `process_next` processes the row after the context, `process_tree` the
    rows of a verified tree, each for its own prefix; `probs_node` gives one node's sampling
    distribution. All return new float32 arrays (the input is not modified); a filtered token is
    -inf (probability 0).

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
                 frequency_penalty: float = 0.0, logits_processors: tuple = ()):
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
        # Prefix functions see every node's whole prefix, so the context itself is kept (only then).
        self.logits_processors = tuple(logits_processors)
        self._context = np.empty(0, np.int64)
        self._n_context = 0

    @classmethod
    def from_params(cls, params, vocab_size: int) -> "LogitsProcessor":
        """From a `draftcore.SamplingParams` (greedy params keep their penalties only)."""
        return cls(vocab_size, temperature=params.temperature if not params.is_greedy else 0.0,
                   top_k=params.top_k, top_p=params.top_p, min_p=params.min_p,
                   repetition_penalty=params.repetition_penalty, presence_penalty=params.presence_penalty,
                   frequency_penalty=params.frequency_penalty, logits_processors=params.logits_processors)

    # -- request state ---------------------------------------------------------------------------
    def start(self, prompt: np.ndarray) -> None:
        """A new request: the prompt's tokens count for the repetition penalty only."""
        self._seen[:] = False
        self._counts[:] = 0
        self._n_seen = 0
        self._n_context = 0
        self._add(prompt, generated=False)

    def update(self, tokens: np.ndarray) -> None:
        """`tokens` (int32[k]) were generated and appended to the context."""
        self._add(tokens, generated=True)

    def _add(self, tokens, generated: bool) -> None:
        if self.logits_processors:
            self._append_context(tokens)
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

    def _append_context(self, tokens) -> None:
        need = self._n_context + len(tokens)
        if need > self._context.shape[0]:
            grown = np.empty(max(need, 2 * self._context.shape[0], 256), np.int64)
            grown[:self._n_context] = self._context[:self._n_context]
            self._context = grown
        self._context[self._n_context:need] = tokens
        self._n_context = need

    # -- processing ------------------------------------------------------------------------------
    def process_next(self, logits: np.ndarray) -> np.ndarray:
        """float32[vocab]: the processed row for the token after the context (prefill)."""
        return self._process(logits[None, :], _ROOT_TOKENS, _ROOT_PARENTS, _ROOT_TOKENS)[0][0]

    def process_tree(self, logits: np.ndarray, tokens: np.ndarray, parents: np.ndarray) -> np.ndarray:
        """float32[m, vocab]: row i processed for node i's prefix (context + drafted ancestors + i).

        logits: float32[n, vocab], the raw logits of the tree's first n nodes; tokens, parents: the tree's arrays.
        """
        nodes = np.arange(logits.shape[0], dtype=np.int32)
        return self._process(logits, tokens, parents, nodes)[0]

    def probs_node(self, logits: np.ndarray, tokens: np.ndarray, parents: np.ndarray, node: int) -> np.ndarray:
        """float32[vocab]: softmax of `process_tree(...)[node]`, filtered tokens exactly 0, computed
        for that one node (the sampling walk processes only the nodes it reaches).

        logits: float32[n, vocab] (a tree's) or float32[vocab] (prefill: tokens/parents ignored).
        """
        if logits.ndim == 1:
            rows, tokens, parents, nodes = logits[None, :], _ROOT_TOKENS, _ROOT_PARENTS, _ROOT_TOKENS
        else:
            rows, nodes = logits[node:node + 1], np.full(1, node, np.int32)
        z, e = self._process(rows, tokens, parents, nodes)
        if e is None:
            return softmax(z)[0]
        return e[0] / e[0].sum()

    def _process(self, logits, tokens, parents, nodes):
        """(processed logits z, exp(z - row max) with filtered tokens 0 — None when greedy) for
        `logits` rows that belong to tree nodes `nodes` (int32, row r is node nodes[r])."""
        z = np.array(logits, np.float32, copy=True, order="C")
        if self.penalised:
            _penalise(z, tokens, parents, nodes, self._seen, self._seen_ids, self._n_seen, self._counts,
                      np.float32(self.repetition_penalty), np.float32(self.presence_penalty),
                      np.float32(self.frequency_penalty))
        if self.logits_processors:
            self._apply_prefix_functions(z, tokens, parents, nodes)
        if not self.warp:
            _check_rows(z.max(axis=1), self)
            return z, None
        if self.temperature != 1.0:
            z /= np.float32(self.temperature)
        if 0 < self.top_k < self.vocab_size:
            z[z < _kth_largest(z, self.top_k)[:, None]] = -np.inf
        zmax = z.max(axis=1)
        _check_rows(zmax, self)
        e = np.exp(z - zmax[:, None])  # p / max(p), float32 like torch's softmax
        if self.top_p < 1.0 or self.min_p > 0.0:
            _nucleus(z, e, zmax, self.top_p, np.float32(self.min_p))
        return z, e


    def _apply_prefix_functions(self, z, tokens, parents, nodes) -> None:
        """Row r becomes fn(prefix of node nodes[r], row) for every user function, in order."""
        context = self._context[:self._n_context]
        for r in range(z.shape[0]):
            path = []
            node = int(nodes[r])
            while node > 0:   # the root is the context's last token already
                path.append(int(tokens[node]))
                node = int(parents[node])
            prefix = np.concatenate([context, np.array(path[::-1], np.int64)]) if path else context.copy()
            for i, fn in enumerate(self.logits_processors):
                z[r] = self._checked_row(i, fn, fn(prefix, z[r]))

    def _checked_row(self, i: int, fn, row) -> np.ndarray:
        """`row` if it is what a processor must return, else BackendError naming the function: a list
        or an integer row would pass np.asarray silently (an int row rounds every score). Nothing
        is written before the check, so a refused row changes no state."""
        if (not isinstance(row, np.ndarray) or row.dtype not in _ROW_DTYPES
                or row.shape != (self.vocab_size,)):
            what = describe(row) if isinstance(row, np.ndarray) else f"{type(row).__name__} {describe(row)}"
            raise BackendError(f"logits_processors[{i}]: {describe(fn)} returned {what}; expected a float32 "
                               f"or float64 numpy array of shape ({self.vocab_size},), one score per token")
        return row


_ROW_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))   # what a logits processor may return
_ROOT_TOKENS = np.zeros(1, np.int32)       # a root-only tree: its prefix is the context
_ROOT_PARENTS = np.full(1, -1, np.int32)


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernels (draftcore.jit)."""
    z = np.zeros((2, 4), np.float32)
    tokens, parents = np.zeros(2, np.int32), np.array([-1, 0], np.int32)
    _penalise(z, tokens, parents, np.arange(2, dtype=np.int32), np.zeros(4, np.bool_), np.zeros(1, np.int32), 0,
              np.zeros(4, np.int32), np.float32(1.0), np.float32(0.0), np.float32(0.0))
    _kth_largest(z, 2)
    _nucleus(z, softmax(z), z.max(axis=1), 0.5, np.float32(0.1))


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax of processed logits (float32, -inf → 0)."""
    z = np.asarray(z, np.float32)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    e /= e.sum(axis=-1, keepdims=True)
    return e


@nb.njit(cache=True)
def _penalise(z, tokens, parents, nodes, seen, seen_ids, n_seen, counts, repetition, presence, frequency):
    """Repetition / presence / frequency penalties on z (float32[m, vocab]) in place, row r for the
    prefix of node i = nodes[r]: context + tokens[path root → i] (root excluded: it is the
    context's last token).

    seen: bool[vocab], tokens in the context; seen_ids[:n_seen]: the same, listed; counts:
    int32[vocab], generated occurrences. Only tokens in the prefix are touched: O(m · (n_seen + depth)).
    """
    extra = np.zeros(z.shape[1], np.int32)  # occurrences on node i's drafted path
    for r in range(z.shape[0]):
        i = nodes[r]
        j = i
        while j > 0:
            extra[tokens[j]] += 1
            j = parents[j]
        for s in range(n_seen):
            t = seen_ids[s]
            z[r, t] = _penalty(z[r, t], counts[t] + extra[t], repetition, presence, frequency)
        j = i
        while j > 0:  # drafted tokens the context lacks: penalise once, clearing `extra` as we go
            t = tokens[j]
            if extra[t] > 0:
                if not seen[t]:
                    z[r, t] = _penalty(z[r, t], extra[t], repetition, presence, frequency)
                extra[t] = 0
            j = parents[j]


def _check_rows(row_max: np.ndarray, options) -> None:
    """InputError unless every processed row has a finite largest logit: a NaN, an overflow to inf or
    a row with every token filtered out leaves nothing to choose, and argmax or sampling would
    then quietly return token 0 (transformers raises on such rows too)."""
    if not np.isfinite(row_max).all():
        bad = float(row_max[~np.isfinite(row_max)][0])
        raise InputError(f"sampling: the processed logits of a row have largest value {bad} (nothing left to "
                         f"choose); the options (temperature={options.temperature}, repetition_penalty="
                         f"{options.repetition_penalty}, presence_penalty={options.presence_penalty}, "
                         f"frequency_penalty={options.frequency_penalty}) or a logits processor overflowed "
                         f"float32 or filtered out every token")


@nb.njit(cache=True, inline="always")
def _penalty(x, count, repetition, presence, frequency):
    """One token's penalties in float32, as torch computes them (parameters are float32 scalars)."""
    x = x * repetition if x < 0 else x / repetition
    if count > 0:
        x = x - frequency * np.float32(count)
        x = x - presence
    return x


@nb.njit(cache=True)
def _kth_largest(z, k):
    """float32[n]: the k-th largest value of each row of z (with multiplicity, as torch.topk),
    from a min-heap of the k largest seen so far: one comparison for most of the vocabulary."""
    n, vocab = z.shape
    out = np.empty(n, np.float32)
    heap = np.empty(k, np.float32)
    for i in range(n):
        for j in range(k):
            heap[j] = z[i, j]
        for j in range(k // 2 - 1, -1, -1):
            _sift_down(heap, j, k)
        for v in range(k, vocab):
            x = z[i, v]
            if x > heap[0]:
                heap[0] = x
                _sift_down(heap, 0, k)
        out[i] = heap[0]
    return out


@nb.njit(cache=True, inline="always")
def _sift_down(heap, j, k):
    while True:
        smallest = j
        left = 2 * j + 1
        if left < k and heap[left] < heap[smallest]:
            smallest = left
        if left + 1 < k and heap[left + 1] < heap[smallest]:
            smallest = left + 1
        if smallest == j:
            return
        heap[j], heap[smallest] = heap[smallest], heap[j]
        j = smallest


_BUCKETS_PER_NAT = 8   # top-p histogram: bucket b holds tokens with zmax - z in [b / 8, (b + 1) / 8)
_N_BUCKETS = 1024      # the last bucket takes everything below zmax - 128 (where e <= 2.6e-56, or 0)


@nb.njit(cache=True)
def _nucleus(z, e, zmax, top_p, min_p):
    """Top-p then min-p on z (float32[n, vocab]) and e = exp(z - zmax) in place (filtered tokens:
    z = -inf, e = 0); zmax: float32[n], the row maxima (so the most likely token has e = 1).

    Top-p (transformers: remove where the ascending cumulative mass is <= 1 - top_p, keep the most
    likely token): in descending probability keep a token while the mass before it is < top_p.
    Only the head of a row is sorted: one pass sums the mass per bucket of zmax - z (buckets are
    ordered like the probabilities), the smallest bucket prefix whose mass reaches top_p holds
    every kept token (the kept set is a top-m set, the prefix a top-c set with c >= m); a second
    pass drops the tokens outside it and the candidates are sorted.
    Min-p: p < min_p · max(p) is e < min_p, since max(e) = 1 (renormalising after top-p scales
    p and max(p) alike).
    """
    n, vocab = z.shape
    mass = np.zeros(_N_BUCKETS, np.float64)
    cand = np.empty(vocab, np.int64)
    for i in range(n):
        row = e[i]
        if top_p < 1.0:
            mass[:] = 0.0
            total = 0.0
            for v in range(vocab):
                if row[v] > 0.0:
                    mass[_bucket(zmax[i] - z[i, v])] += row[v]
                    total += row[v]
            need = top_p * total
            last = 0
            acc = mass[0]
            while acc < need and last < _N_BUCKETS - 1:
                last += 1
                acc += mass[last]
            n_cand = 0
            for v in range(vocab):
                if row[v] > 0.0 and _bucket(zmax[i] - z[i, v]) <= last:
                    cand[n_cand] = v
                    n_cand += 1
                else:  # outside the head (or of probability 0 in float32, as for transformers)
                    row[v] = 0.0
                    z[i, v] = -np.inf
            heads = cand[:n_cand]
            order = np.argsort(-row[heads], kind="mergesort")  # descending p; ties: lower id first
            before = 0.0
            for j in range(n_cand):
                v = heads[order[j]]
                if j == 0 or before < need:
                    before += row[v]
                else:
                    row[v] = 0.0
                    z[i, v] = -np.inf
        if min_p > 0.0:
            for v in range(vocab):
                if row[v] < min_p:
                    row[v] = 0.0
                    z[i, v] = -np.inf


@nb.njit(cache=True, inline="always")
def _bucket(gap):
    b = gap * _BUCKETS_PER_NAT
    return int(b) if b < _N_BUCKETS - 1 else _N_BUCKETS - 1
