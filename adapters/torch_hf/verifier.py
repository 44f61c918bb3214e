"""`HFVerifier`: any transformers causal LM, as it is, behind draftcore's Verifier protocol.

One tree forward::

    cache (kv_cache.py)    [ context: n_past positions | tree: n nodes ]
    input_ids     int64[1, n]           tree.tokens
    position_ids  int64[1, n]           n_past + tree.depths
    attention_mask float[1, 1, n, n_past + n]   additive: 0 where seen, dtype-min where not
                                                (see masks.py for why never a bool mask)

then `commit(path)` keeps the context plus the path's KV (a slice when the path is the first k nodes,
a gather of the tail otherwise) and drops the rest of the tree.

The model is not patched or wrapped: only its public forward is called, with a 4-D mask, explicit
positions and a cache owned here. On CPU, verify calls the model's own decoder and output Linear in
two steps instead (head.py: `W @ hidden.T` is 2-6x faster than torch's GEMM for a few rows), when a
check at construction shows the two give the forward's logits. Inside that forward the Linear layers
run as torch runs them, through oneDNN on copies of their weights packed once at construction
(packed_linear.py), or as `W @ x.T` (weight_major.py), per tree size the way that measured fastest
at construction on this machine. A model that
ignores the 4-D mask would silently give wrong logits, so the constructor checks it on a small
branching tree against its own one-token-per-forward decoding (draftcore.selfcheck; tolerances and advice in selfcheck.py).
"""
from __future__ import annotations

import inspect
from contextlib import contextmanager

import numpy as np
import torch

from draftcore.checks import check_n_logits, check_path, check_tree
from draftcore.committed_tokens import CommittedTokens
from draftcore.errors import BackendError, ConfigError, InputError, describe
from draftcore.tree import DraftTree
from draftcore.validate import flag, positive_int, token_array, tokenizer_or_none

from . import kv_cache
from .attention_backends import cudnn_attention_may_run, without_cudnn
from .fastest_forward import FastestForward
from .head import checked_linear_ways, checked_split_head, decoder_of
from .masks import tree_forward_inputs
from .prefix_reuse import attention_pairs_per_row, reuse_plan
from .selfcheck import check_tree_attention, tolerance

# Attention kernels that take no arbitrary mask: refused up front with a message, not by the self-check.
_MASKLESS_ATTENTION = ("flash_attention_2", "flash_attention_3", "paged_attention")


class HFVerifier:
    """Verifier over a transformers causal LM (PyTorch, CUDA or CPU; fp32, fp16 or bf16).

    model: a `*ForCausalLM` in eval mode, with attn_implementation "sdpa" or "eager" (the model's
        device and dtype are used as they are; inputs and masks follow them).
    max_context: the most tokens the cache may hold; default config.max_position_embeddings, capped
        at the sliding window for models with sliding-window layers (the tree mask replaces the
        model's own and applies no window: the two agree only while the context fits the window).
    self_check: run one branching tree through the verifier at construction and compare with plain
        decoding, one token per forward; raise BackendError if the model ignores the tree mask
        (draftcore.selfcheck, with selfcheck.py's tolerance for the model's dtype).
    tokenizer: optional; gives `encode`/`decode` so `draftcore.speculate` accepts text.
    linear_ways: CPU only: how a forward of each size runs the Linear layers, {tokens: way} with
        way "torch" (torch's own), "weight-major" (`W @ x.T`, weight_major.py) or "packed" (oneDNN
        on packed copies of the weights, packed_linear.py); a tree of n nodes takes the way of the
        smallest key >= n, beyond the largest key that key's way. None (default): timed at
        construction at 1, 2, 4, 8 and 16 tokens (a few seconds for a 135M model), the fastest
        way kept per size. Given (e.g. another verifier's `linear_ways` on this machine), nothing is
        timed, and a way that cannot run or does not give the model's logits is a ConfigError.
    packed_linear: CPU float32 only: the packed copies of the weights (SmolLM2-135M, 16 nodes
        175 -> 156 ms at construction on a 2-core EPYC; the copies cost the weights' memory again).
        None (default): made where they take at most a quarter of the free memory, kept where they
        measure fastest at some size; True: made (ConfigError where they cannot be) and standing in
        for torch's Linear at every size; False: never. Weights changed through `.data` afterwards
        are not seen by the copies: build a new verifier then.
    reuse_prefix: True (default): `prefill` keeps the cached KV of the longest prefix the new prompt
        shares with the tokens already in the cache (the last request's prompt and output), and
        runs only the rest of the prompt: a shared system prompt or tool schema, or a chat's earlier
        turns, is computed once. The kept positions' KV is what earlier forwards computed, so the
        logits may differ from a fresh prefill's in the last bits, as a tree verify's do (a
        near-tie may then decode differently from plain decoding). False: every prefill runs the
        whole prompt from an empty cache.
    """

    def __init__(self, model, *, max_context: int | None = None, self_check: bool = True, tokenizer=None,
                 linear_ways: dict[int, str] | None = None, packed_linear: bool | None = None,
                 reuse_prefix: bool = True):
        # Checked first: a bad option fails before any work (bool("no") is True, so no coercion).
        self_check = flag("self_check", self_check)
        tokenizer = tokenizer_or_none("tokenizer", tokenizer)
        config = getattr(model, "config", None)
        if config is None or not callable(model):
            raise ConfigError(f"model: expected a transformers causal LM (with .config), got {describe(model)}")
        if getattr(model, "training", False):
            # Dropout in training mode makes every forward random: nothing could be verified.
            raise ConfigError(f"model: {type(model).__name__} is in training mode; call model.eval() first")
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        attn = getattr(config, "_attn_implementation", None)
        if attn in _MASKLESS_ATTENTION:
            raise ConfigError(
                f"model: attn_implementation={attn!r} takes no arbitrary attention mask, so it cannot "
                f"verify a draft tree; load the model with attn_implementation='sdpa' or 'eager'")

        self._model = model
        self._tokenizer = tokenizer
        weight = _first_weight(model)
        self._device = weight.device
        self._dtype = getattr(model, "dtype", weight.dtype)   # the mask dtype must match the scores
        self._vocab_size = positive_int("model.config.vocab_size", getattr(text_config, "vocab_size", None))
        self._max_context = _max_context(text_config, max_context)
        linear_ways = checked_linear_ways(linear_ways)
        if packed_linear is not None and not isinstance(packed_linear, bool):
            raise ConfigError(f"packed_linear: expected None, True or False, got {describe(packed_linear)}")
        self._reuse_prefix = flag("reuse_prefix", reuse_prefix)
        # what attention costs against Linear work in this model: prices a prefill's reuse plan
        self._pairs_per_row = attention_pairs_per_row(model)
        # Prefill only needs the last position's logits; skip the [T, vocab] head matmul when we can.
        self._prefill_kwargs = ({"logits_to_keep": 1}
                                if "logits_to_keep" in inspect.signature(model.forward).parameters else {})

        self._cache = None          # kv_cache.new_cache() once prefilled
        self._n_past = 0            # committed tokens in the cache
        self._tree = None           # last verified, not yet committed DraftTree (its KV follows n_past)
        self._committed = CommittedTokens(self._max_context)   # the cache's tokens (what a prefill may keep)
        self._prefix_reused = 0     # prompt tokens whose KV the last prefill kept

        # On CPU, verify runs the decoder, then `W @ hidden.T` (head.py), when that gives the model's logits.
        self._split_head = checked_split_head(model, self._device, self._dtype, self._vocab_size,
                                              tolerance(self._dtype, self._device), linear_ways, packed_linear)
        # The cache argument's name (`cache` since transformers 5.24) as the forward that verify calls declares it
        self._prefill_cache = kv_cache.cache_keyword(model)
        self._verify_cache = kv_cache.cache_keyword(decoder_of(model) if self._split_head is not None else model)
        # A step without drafts runs the faster, measured per context length, of generate()'s own
        # forward and the split head (fastest_forward.py): never slower than the user's own decoding.
        # Where sdpa may run cuDNN's attention (CUDA, fp16/bf16), one-node and tree forwards each
        # race a twin without it (attention_backends.py).
        forwards = {"generate": self._generate_forward}
        trees = {"tree": self._tree_forward}
        if self._split_head is not None:
            forwards["split"] = self._split_forward
        if cudnn_attention_may_run(self._device, self._dtype, attn):
            forwards["generate without cuDNN"] = without_cudnn(self._generate_forward)
            trees["tree without cuDNN"] = without_cudnn(self._tree_forward)
        # on a GPU a forward returns before its kernels finish: a timed trial waits for them
        wait = (lambda _: torch.cuda.synchronize(self._device)) if self._device.type == "cuda" else None
        self._one_token = FastestForward(forwards, wait=wait)
        self._trees = FastestForward(trees, wait=wait)
        if self_check:
            check_tree_attention(self)
            self._one_token.forget()
            self._trees.forget()

    # ---------------------------------------------------------------- protocol attributes

    @property
    def vocab_size(self) -> int:
        """Logits per position (the model's output size, which may exceed the tokenizer's)."""
        return self._vocab_size

    @property
    def n_past(self) -> int:
        """Committed tokens whose KV is in the cache (prompt + accepted tokens, root excluded)."""
        return self._n_past

    @property
    def prefix_reused(self) -> int:
        """Prompt tokens whose cached KV the last `prefill` kept (reuse_prefix), 0 for a fresh one."""
        return self._prefix_reused

    @property
    def max_context(self) -> int:
        """The most positions the cache may hold: context plus one verified tree."""
        return self._max_context

    @property
    def model(self):
        """The wrapped model (as given)."""
        return self._model

    @property
    def dtype(self) -> torch.dtype:
        """The model's dtype (also the dtype of the additive tree mask)."""
        return self._dtype

    @property
    def split_head(self) -> bool:
        """True when verify runs the decoder and then `W @ hidden.T` (CPU; head.py), False when
        every forward is the model's own."""
        return self._split_head is not None

    @property
    def linear_ways(self) -> dict[int, str] | None:
        """How a forward of each size runs the Linear layers (CPU: {tokens: way}, as the
        `linear_ways` argument takes it); None where every forward is the model's own."""
        return None if self._split_head is None else dict(self._split_head.ways)

    @property
    def linear_timings(self) -> dict:
        """Construction's medians behind `linear_ways`, {tokens: {way: ms}}; empty where nothing
        was timed (given ways, or no split head)."""
        return {} if self._split_head is None else self._split_head.timings

    @property
    def packed_linear(self) -> bool:
        """True when verify runs the Linear layers of some tree sizes through oneDNN on packed
        weights (CPU; packed_linear.py)."""
        return self._split_head is not None and self._split_head.packed is not None

    @property
    def device(self) -> torch.device:
        """Where inputs, masks and the KV cache live (the input embeddings' device)."""
        return self._device

    # ---------------------------------------------------------------- protocol methods

    def prefill(self, prompt, n_logits: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Start a new sequence from `prompt` (int32[T], 1 <= T <= max_context), dropping any other.

        Returns (int32[1] the last position's argmax, taken on the model's device;
        float32[n_logits, vocab_size] its logits), n_logits 0 or 1. Afterwards n_past == T.
        With reuse_prefix, the KV of the longest prefix (at most T - 1 tokens: the last position's
        logits need a forward) shared with the committed tokens is kept, and only the rest runs, in
        one forward or in chunks, whichever of those and a fresh prefill is priced cheapest in this
        model's Linear and attention work (prefix_reuse.py says how).
        """
        n_logits = check_n_logits(n_logits, 1)
        prompt = token_array("prompt", prompt, self._vocab_size)
        if prompt.shape[0] > self._max_context:
            raise InputError(f"prompt: {prompt.shape[0]} tokens exceed max_context {self._max_context}")
        keep, chunk = reuse_plan(self._shared_prefix(prompt), prompt.shape[0], self._pairs_per_row)
        if keep:
            cache = self._cache
            kv_cache.truncate(cache, keep)   # drops the rest of the old sequence and any pending tree
        else:
            cache = kv_cache.new_cache(self._max_context)
        self.reset()  # before the forward, so a failing forward leaves an empty verifier, not a stale or cut one
        with torch.inference_mode():
            # No attention_mask: the model builds its own causal mask (sdpa: is_causal) for a prompt,
            # and for the rest of one behind kept positions, a causal mask over the cache; that rest
            # runs in chunks that keep its attention within a fresh prefill's (prefix_reuse.py).
            for start in range(keep, prompt.shape[0], chunk):
                end = min(start + chunk, prompt.shape[0])
                ids = torch.from_numpy(prompt[start:end]).to(self._device, torch.long)[None]
                positions = torch.arange(start, end, device=self._device)[None]
                out = self._model(input_ids=ids, position_ids=positions, use_cache=True,
                                  **{self._prefill_cache: cache}, **self._prefill_kwargs)
            result = self._to_host(_logits(out)[0, -1:], n_logits)
        self._expect_cache_length(cache, prompt.shape[0], "prefill")
        self._cache, self._n_past, self._prefix_reused = cache, int(prompt.shape[0]), keep
        self._committed.record(prompt[keep:], keep)
        return result

    def cached_prefix(self, prompt) -> int:
        """How many leading tokens of `prompt` (int32[T]) a prefill would keep from the cache now
        (0 without reuse_prefix); changes nothing. A pool of verifiers can hand a request the one
        that holds most of its prompt."""
        prompt = token_array("prompt", prompt, self._vocab_size)
        return reuse_plan(self._shared_prefix(prompt), prompt.shape[0], self._pairs_per_row)[0]

    def _shared_prefix(self, prompt: np.ndarray) -> int:
        """How many leading tokens of `prompt` share the cached tokens (CommittedTokens, at most
        T - 1); 0 without reuse_prefix or a cache. Whether a prefill keeps them: `reuse_plan`."""
        if not self._reuse_prefix or self._cache is None:
            return 0
        return self._committed.shared_prefix(prompt, self._n_past)

    def verify(self, tree: DraftTree, n_logits: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """One forward over every node of `tree` (positions n_past + depths, tree-masked).

        tree: a DraftTree of n nodes; tokens[0] is the last accepted token (not yet in the cache).
        Returns (tokens int32[n], the argmax of every node's logits; logits float32[n_logits,
        vocab_size], the logits of nodes 0 .. n_logits - 1). The argmax runs where the logits live,
        so on a GPU only n ints and the n_logits rows asked for reach the host: a 60-node lookahead
        window costs 60 ints, not 60 x vocab floats. Every node is evaluated (no -1 tokens). The
        tree's KV stays in the cache until `commit`; verifying again before committing discards it.
        """
        if self._cache is None:
            raise InputError("tree: verify() was called before prefill(); prefill the prompt first")
        check_tree(tree, self._vocab_size)
        n = len(tree)
        n_logits = check_n_logits(n_logits, n)
        if self._n_past + n > self._max_context:
            raise InputError(f"tree: n_past ({self._n_past}) + {n} tree nodes = {self._n_past + n} "
                             f"exceed max_context {self._max_context}")
        self._drop_tree()
        try:
            with torch.inference_mode():
                if n == 1:   # no mask to build: one query sees every cached position
                    token = torch.from_numpy(tree.tokens).to(self._device, torch.long)[None]
                    logits = self._one_token(token, self._n_past)
                else:
                    forward = dict(tree_forward_inputs(tree, self._n_past, self._dtype, self._device),
                                   use_cache=True, **{self._verify_cache: self._cache})
                    logits = self._trees(forward, self._n_past)
                result = self._to_host(logits, n_logits)
        except BaseException:
            kv_cache.truncate(self._cache, self._n_past)  # a failed forward may have grown some layers
            raise
        self._expect_cache_length(self._cache, self._n_past + n, "verify")
        self._tree = tree
        return result

    def _generate_forward(self, token: torch.Tensor, n_past: int) -> torch.Tensor:
        """[1, vocab] logits of one token through the model's forward as generate() calls it."""
        positions = torch.tensor([[n_past]], device=self._device)
        out = self._model(input_ids=token, position_ids=positions,
                          attention_mask=torch.ones((1, n_past + 1), dtype=torch.long, device=self._device),
                          use_cache=True, **{self._prefill_cache: self._cache}, **self._prefill_kwargs)
        return _logits(out)[0, -1:]

    def _tree_forward(self, forward: dict, n_past: int) -> torch.Tensor:
        """[n, vocab] logits of one tree forward (`forward`: the model's keyword arguments)."""
        if self._split_head is not None:
            return self._split_head(**forward)         # [n, vocab] on the model's device
        return _logits(self._model(**forward))[0]

    def _split_forward(self, token: torch.Tensor, n_past: int) -> torch.Tensor:
        """[1, vocab] logits of one token through the split head, without a mask (one query sees
        every cached position)."""
        positions = torch.tensor([[n_past]], device=self._device)
        return self._split_head(input_ids=token, position_ids=positions, use_cache=True,
                                **{self._verify_cache: self._cache})

    @property
    def kernel_choices(self) -> dict:
        """What construction and the races of forwards chose on this machine (for reports); "tree"
        only where tree forwards race (CUDA, fp16/bf16: with or without cuDNN's attention)."""
        head = self._split_head
        choices = {"split_head": head is not None, "linear_ways": self.linear_ways,
                   "packed_linear": self.packed_linear, "one_token": self.one_token_choices,
                   "one_token_switches": self._one_token.switches}
        if len(self._trees.forwards) > 1:
            choices["tree"] = self._trees.choices()
        return choices

    @contextmanager
    def first_forwards_only(self):
        """Within the block every verify runs the first of its forwards, nothing raced or timed: a
        one-node step as `generate()` runs it, a tree as sdpa picks its kernels. For a diagnosis
        (benchmarks/gpu_check.py: the cost table without the verifier's choices); the choices made
        before it hold again after it."""
        with self._one_token.first_only(), self._trees.first_only():
            yield

    @property
    def one_token_choices(self) -> dict[str, str]:
        """{context range: "generate" or "split"}: which forward a step without drafts runs at
        each context length measured so far (fastest_forward.py)."""
        return self._one_token.choices()

    def _to_host(self, logits: torch.Tensor, n_logits: int) -> tuple[np.ndarray, np.ndarray]:
        """(int32[n] argmax of every row, float32[n_logits, vocab] C-contiguous copy of the first
        rows) on the host, from [n, vocab] logits on the model's device."""
        tokens = logits.argmax(-1).to(torch.int32).cpu().numpy()
        if n_logits == 0:
            return tokens, np.empty((0, self._vocab_size), np.float32)
        # contiguous: the split head's logits are a transposed view, and rows are read one by one
        rows = logits[:n_logits].to(torch.float32).contiguous().cpu().numpy()
        return tokens, rows

    def commit(self, path) -> None:
        """Append the KV of `path` to the context and drop every other node of the last tree.

        path: int32[k], 1 <= k, node indices of the last verified tree, root first (path[0] == 0),
        each the parent of the next. A path that is the first k nodes (a chain draft) is a slice;
        any other is a gather of the tree's tail (kv_cache.keep_path). Afterwards n_past grows by k.
        """
        if self._tree is None:
            raise InputError("path: commit() needs a verified tree; call verify() first "
                             "(each verified tree can be committed once)")
        path = check_path(path, self._tree)
        k = path.shape[0]
        try:
            with torch.inference_mode():
                if np.array_equal(path, np.arange(k)):
                    if k < len(self._tree):   # else the whole tree is the path (a one-node step): nothing to drop
                        kv_cache.truncate(self._cache, self._n_past + k)
                else:
                    rows = torch.from_numpy(path).to(self._device, torch.long)
                    kv_cache.keep_path(self._cache, self._n_past, rows)
        except BaseException:
            # a gather stopped between layers leaves them out of step: no later prefill may reuse them
            self.reset()
            raise
        self._committed.record(self._tree.tokens[path], self._n_past)
        self._n_past += k
        self._tree = None

    # ---------------------------------------------------------------- text and state

    @property
    def encode(self):
        """encode(text: str) -> int32[T]; present only when a tokenizer was given (hasattr is False
        otherwise, which is how `speculate` tells whether text prompts are accepted)."""
        if self._tokenizer is None:
            raise AttributeError("encode: this HFVerifier was built without a tokenizer")
        return self._encode

    @property
    def decode(self):
        """decode(ids: int32[k]) -> str; present only when a tokenizer was given."""
        if self._tokenizer is None:
            raise AttributeError("decode: this HFVerifier was built without a tokenizer")
        return self._decode

    def _encode(self, text: str) -> np.ndarray:
        if not isinstance(text, str):
            raise InputError(f"text: expected a str, got {describe(text)}")
        return np.asarray(self._tokenizer.encode(text), dtype=np.int32)

    def _decode(self, ids) -> str:
        return self._tokenizer.decode(token_array("ids", ids, allow_empty=True).tolist())

    def reset(self) -> None:
        """Forget the sequence: empty cache, n_past 0, no pending tree (the next prefill reuses nothing)."""
        self._cache, self._n_past, self._tree, self._prefix_reused = None, 0, None, 0

    def plain_logits(self, tokens) -> np.ndarray:
        """float32[T, vocab_size]: a plain causal forward over `tokens` (int32[T]) with no cache
        and no custom mask, the reference the tree forward must match. State is not touched."""
        tokens = token_array("tokens", tokens, self._vocab_size)
        with torch.inference_mode():
            ids = torch.from_numpy(tokens).to(self._device, torch.long)[None]
            positions = torch.arange(tokens.shape[0], device=self._device)[None]
            out = self._model(input_ids=ids, position_ids=positions, use_cache=False)
            return _logits(out)[0].float().cpu().numpy()

    def _drop_tree(self) -> None:
        if self._tree is not None:
            kv_cache.truncate(self._cache, self._n_past)
            self._tree = None

    def _expect_cache_length(self, cache, expected: int, where: str) -> None:
        got = kv_cache.cache_length(cache)
        if got != expected:
            self.reset()
            raise BackendError(
                f"{type(self._model).__name__}.forward: after {where} the KV cache holds {got} positions, "
                f"expected {expected}; the model does not use the KV cache it was passed")

    def __repr__(self) -> str:
        return (f"HFVerifier({type(self._model).__name__}, device={self._device}, dtype={self._dtype}, "
                f"n_past={self._n_past}, max_context={self._max_context}, split_head={self.split_head}, "
                f"linear_ways={self.linear_ways})")


def _max_context(text_config, max_context) -> int:
    """The explicit value, else max_position_embeddings (capped by a sliding window in use)."""
    if max_context is not None:
        return positive_int("max_context", max_context)
    limit = getattr(text_config, "max_position_embeddings", None)
    if limit is None:
        raise ConfigError("max_context: the model config has no max_position_embeddings; pass max_context=")
    window = getattr(text_config, "sliding_window", None)
    layer_types = getattr(text_config, "layer_types", None) or ()
    if window and "sliding_attention" in layer_types:
        limit = min(limit, window)
    return positive_int("model.config.max_position_embeddings", limit)


def _first_weight(model) -> torch.Tensor:
    """The input embedding matrix (where input ids must go), else the model's first parameter."""
    get = getattr(model, "get_input_embeddings", None)
    embeddings = get() if callable(get) else None
    if embeddings is not None and getattr(embeddings, "weight", None) is not None:
        return embeddings.weight
    for param in model.parameters():
        return param
    raise ConfigError(f"model: {type(model).__name__} has no parameters")


def _logits(out) -> torch.Tensor:
    """[batch, q, vocab] logits from a model output (ModelOutput or tuple)."""
    return out.logits if hasattr(out, "logits") else out[0]
