"""LlamaCppVerifier: the draftcore Verifier over a llama.cpp context (GPU offload or CPU).

Two modes, chosen from what the context can do (context.py) and reported by `chain_only`:

- tree mode (kv_unified, n_seq_max >= leaves + 1): ONE llama_decode per draft tree, every node
  evaluated. Node i sits at position n_past + depth[i] with the sequence ids of the leaves below it
  (batch.py); commit keeps the accepted path as sequence 0 and frees every other cell with two
  sequence operations.
- chain-only mode (a stock `llama_cpp.Llama`: one sequence, no unified cache): a chain draft is still
  one llama_decode; a branching tree is verified branch by branch (branches.py), each extra decode
  announced once with a ChainOnlyWarning. Never silently slow. Only the branches someone reads are
  decoded: those greedy acceptance walks into, those holding lookahead nodes (a drafter observes
  them) and those holding the first n_logits nodes. Every other node comes back as -1
  (draftcore.checks.MISSING), never as a made-up token.

KV cache invariants between calls (checked by the tests):

    seq 0 holds exactly the committed tokens, at positions 0 .. n_past - 1, and no other cells exist.
    After verify: the tree's cells exist (tree mode: tagged with leaf seqs; chain: in seq 0),
    and commit(path) restores the invariant with n_past += len(path).
    Cells hold positions in increasing order: CPU flash attention sums over cells in cell order, so
    a cache whose cells were reordered gives other logits (up to 0.7 on Q4_1 SmolLM2) than plain
    decoding. A tree batch therefore goes in depth-first order, best branch first, and a commit
    whose path is not a prefix of the batch decodes the path's tail again (n_redecoded; README.md).

The llama.cpp logits buffer is read through a numpy view (no per-element Python): the argmax of every
row is taken in place, and only the n_logits rows asked for are copied out (the next llama_decode
overwrites the buffer).
"""
from __future__ import annotations

import ctypes
import warnings
import weakref

import numpy as np

from draftcore.checks import MISSING, check_n_logits, check_path, check_token, check_tree
from draftcore.committed_tokens import CommittedTokens
from draftcore.errors import BackendError, ConfigError, InputError, describe
from draftcore.selfcheck import N_POSITIONS, check_tree_attention
from draftcore.tree import DraftTree
from draftcore.validate import flag, positive_int, token_array

from . import branches
from .batch import Batch, leaf_membership
from .context import (DEFAULT_N_BATCH, Limits, default_threads, import_llama_cpp, load_model, new_context,
                      offloads_layers, read_limits, split_overrides, tree_context_params)
from .numerics import check_split_attention, default_max_tree_nodes, is_float_weights, warn_if_inexact

DEFAULT_SEQ_MAX = 64  # a tree of n >= 2 nodes has at most n - 1 leaves: any tree of up to 64 nodes


class ChainOnlyWarning(UserWarning):
    """A branching draft tree is verified with several llama_decode calls (context cannot hold a tree)."""


class LlamaCppVerifier:
    """Verifier over a llama.cpp context. Build with `from_gguf` or `from_llama`.

    Attributes:
        vocab_size:  logits per position.
        n_past:      committed tokens in the KV cache (sequence 0).
        max_context: n_ctx, the cells of the KV cache; prompt + generated + one tree must fit.
        max_tree_nodes: the most nodes one verify takes: at most n_batch (one llama_decode holds the
                     tree, or in chain-only mode its longest branch); by default n_batch, capped at 63
                     where no layer is offloaded (numerics.CPU_TREE_NODES), or as asked at construction.
        max_tree_leaves: the most leaves a tree may have: n_seq_max - 1 in tree mode (leaf k is
                     sequence k + 1); None in chain-only mode, where branches go one decode each.
        chain_only:  True when branching trees are verified branch by branch (see ChainOnlyWarning).
        n_decodes:   llama_decode calls so far (after the construction self-check);
        n_redecoded: tokens decoded a second time: by a commit whose path left the batch's best
                     branch, or in chain-only mode by a branch whose ancestors the cache had dropped.
        prefix_reused: prompt tokens whose cached KV the last prefill kept (reuse_prefix), 0 for a
                     fresh one.
        self_check_error: the construction self-check's largest |tree - one-token| logit difference,
                     relative to the largest logit (None when it did not run). Above
                     numerics.NEAR_TIE_ONLY the construction warned (InexactBatchWarning); 0 says
                     only that its 5-node tree was bit-exact (larger batches: numerics.py).
        split_attention_from: the context length (cached tokens) from which this context's
                     one-token decoding splits its attention across threads and a verify's does not
                     (numerics.split_attention_from; warned at construction), None where it never
                     does or the self-check did not run.
    """

    def __init__(self, lib, model, ctx, limits: Limits, *, keepalive=(), llm=None, max_tree_nodes=None,
                 offloaded: bool = True, reuse_prefix: bool = False):
        """Internal: use `from_gguf` / `from_llama`. `keepalive` holds whatever owns model/ctx;
        `offloaded`: whether any layer runs on a GPU (sets the default max_tree_nodes)."""
        self._lib = lib
        self._model = model
        self._ctx = ctx
        self._mem = lib.llama_get_memory(ctx)
        self._vocab = lib.llama_model_get_vocab(model)
        self._keepalive = keepalive
        self._llm = llm
        self.limits = limits
        self.vocab_size = int(lib.llama_vocab_n_tokens(self._vocab))
        self.max_context = limits.n_ctx
        self.chain_only = limits.max_leaves == 0
        self.max_tree_leaves = None if self.chain_only else limits.max_leaves
        self.max_tree_nodes = default_max_tree_nodes(limits.n_batch, offloaded)
        if max_tree_nodes is not None:
            self.max_tree_nodes = positive_int("max_tree_nodes", max_tree_nodes)
            if self.max_tree_nodes > limits.n_batch:
                raise ConfigError(f"max_tree_nodes: expected at most n_batch={limits.n_batch} (the most "
                                  f"tokens one llama_decode takes), got {max_tree_nodes}")
        self.n_past = 0
        self.prefix_reused = 0
        # A borrowed Llama may decode into its context between our calls: only an own one is reused.
        self._reuse_prefix = flag("reuse_prefix", reuse_prefix) and llm is None
        self._committed = CommittedTokens(self.max_context)   # the tokens of seq 0's cells
        self.n_decodes = 0
        self.n_redecoded = 0
        self._batch = Batch(lib, limits.n_batch, max(1, limits.n_seq_max))
        self._pending = None      # what the last verify left in the cache, until commit
        self._prefilled = False
        self._warned = False
        self.self_check_error = None  # the construction self-check's relative error, when it ran
        self.split_attention_from = None  # context length from which batches stop being exact, if any

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_gguf(cls, path, *, n_ctx: int = 4096, n_batch: int = DEFAULT_N_BATCH, n_gpu_layers: int = 0,
                  n_threads: int | None = None, n_seq_max: int = DEFAULT_SEQ_MAX, type_k: int | None = None,
                  type_v: int | None = None, flash_attn: bool | None = None, max_tree_nodes: int | None = None,
                  self_check: bool = True, verbose: bool = False, reuse_prefix: bool = True,
                  **llama_kwargs) -> "LlamaCppVerifier":
        """Load a GGUF model into a tree-capable context (kv_unified=True, n_seq_max sequences).

        n_threads:   CPU threads (default: the cores this process may use).
        type_k/v:    KV cache ggml types (e.g. llama_cpp.GGML_TYPE_F32 for exactness tests).
        flash_attn:  True / False, or None for llama.cpp's automatic choice.
        max_tree_nodes: the most nodes one verify takes (default n_batch, capped at 63 where
                     n_gpu_layers is 0: on a CPU, batches of 64+ tokens take other kernels than one
                     token, while batches of up to 63 on Q4_0/Q4_1/Q8_0 weights with flash attention
                     compute bit-identically to one-token decoding; numerics.py).
        self_check:  run one branching tree at construction and compare its logits with one-token
                     decoding (draftcore.selfcheck); BackendError if the context does not honour the
                     tree's sequence ids.
        reuse_prefix: True (default): a prefill keeps the cells of the longest prefix the prompt
                     shares with the tokens in the cache (the last request's prompt and output) and
                     decodes the rest, as llama-cpp-python's own Llama.generate does; False: every
                     prefill decodes the whole prompt into an empty cache.
        llama_kwargs: any other llama_context_params / llama_model_params field by name.
        """
        lib = import_llama_cpp()
        reuse_prefix = flag("reuse_prefix", reuse_prefix)
        self_check = flag("self_check", self_check)   # before the model loads; bool("no") is True
        n_ctx = positive_int("n_ctx", n_ctx)
        n_batch = positive_int("n_batch", n_batch)
        n_seq_max = positive_int("n_seq_max", n_seq_max, minimum=2)
        n_threads = default_threads() if n_threads is None else positive_int("n_threads", n_threads)
        model_kw, context_kw = split_overrides(lib, llama_kwargs)
        if not verbose:
            import logging
            logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # as Llama(verbose=False) does
        model = load_model(lib, path, n_gpu_layers=n_gpu_layers, overrides=model_kw)
        try:
            params = tree_context_params(lib, n_ctx=n_ctx, n_batch=n_batch, n_seq_max=n_seq_max,
                                         n_threads=n_threads, type_k=type_k, type_v=type_v,
                                         flash_attn=flash_attn, overrides=context_kw)
            ctx = new_context(lib, model, params)
        except BaseException:
            lib.llama_model_free(model)
            raise
        owner = _Owner(lib, model, ctx)
        offloaded = offloads_layers(lib, n_gpu_layers)
        verifier = cls(lib, model, ctx, read_limits(lib, ctx), keepalive=(owner,), max_tree_nodes=max_tree_nodes,
                       offloaded=offloaded, reuse_prefix=reuse_prefix)
        return verifier._checked(params, offloaded) if self_check else verifier

    @classmethod
    def from_llama(cls, llm, *, strict: bool = False, own_context: bool = False,
                   n_seq_max: int = DEFAULT_SEQ_MAX, max_tree_nodes: int | None = None,
                   self_check: bool = True, reuse_prefix: bool = True) -> "LlamaCppVerifier":
        """Verify with an existing `llama_cpp.Llama`, whose settings are left as they are.

        By default its own context is used. A stock Llama has one sequence and a split cache, so
        branching trees are then verified branch by branch (chain_only; warned once). Instead:
          strict=True       raise ConfigError naming the settings a tree needs;
          own_context=True  make a second context over the same loaded weights with tree settings
                            (its n_ctx, n_batch, threads and KV types, plus kv_unified and n_seq_max):
                            one llama_decode per tree, at the cost of one more KV cache.
        max_tree_nodes and self_check: as in `from_gguf`. The self-check on the Llama's own context
        starts a sequence there, as any prefill does.
        The verifier drives the context directly and calls `llm.reset()` at each prefill, so the
        Llama never reuses a KV prefix it no longer holds. reuse_prefix (as in `from_gguf`) applies
        to an own context only: the Llama's own context may be decoded into by the Llama between
        two requests, so there every prefill starts from an empty cache.
        """
        lib = import_llama_cpp()
        reuse_prefix = flag("reuse_prefix", reuse_prefix)   # checked, though a borrowed context is never reused
        self_check = flag("self_check", self_check)
        if not isinstance(llm, lib.Llama):
            raise ConfigError(f"llm: expected a llama_cpp.Llama, got {describe(llm)}")
        params, offloaded = llm.context_params, offloads_layers(lib, llm.model_params.n_gpu_layers)
        if own_context:
            n_seq_max = positive_int("n_seq_max", n_seq_max, minimum=2)
            params = tree_context_params(lib, llm.context_params, n_seq_max=n_seq_max)
            ctx = new_context(lib, llm.model, params)
            owner = _Owner(lib, None, ctx)
            verifier = cls(lib, llm.model, ctx, read_limits(lib, ctx), keepalive=(owner, llm),
                           max_tree_nodes=max_tree_nodes, offloaded=offloaded, reuse_prefix=reuse_prefix)
        else:
            limits = read_limits(lib, llm.ctx)
            if limits.max_leaves == 0 and strict:
                raise ConfigError(
                    f"llm: its context cannot hold a draft tree (n_seq_max={limits.n_seq_max}, "
                    f"kv_unified={limits.unified}); a tree of L leaves needs kv_unified=True and "
                    f"n_seq_max >= L + 1 (e.g. n_seq_max={DEFAULT_SEQ_MAX} for trees of up to "
                    f"{DEFAULT_SEQ_MAX} nodes). llama_cpp.Llama() cannot set these: use "
                    f"LlamaCppVerifier.from_llama(llm, own_context=True) or "
                    f"LlamaCppVerifier.from_gguf(path, n_seq_max={DEFAULT_SEQ_MAX})")
            verifier = cls(lib, llm.model, llm.ctx, limits, keepalive=(llm,), llm=llm, max_tree_nodes=max_tree_nodes,
                           offloaded=offloaded)
        return verifier._checked(params, offloaded) if self_check else verifier

    def close(self) -> None:
        """Free what this verifier created (a borrowed Llama is left alone); the verifier is done."""
        for obj in self._keepalive:
            if isinstance(obj, _Owner):
                obj.close()
        self._keepalive = ()
        self._ctx = self._mem = None
        self._pending, self._prefilled = None, False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _checked(self, params, offloaded: bool) -> "LlamaCppVerifier":
        """This verifier once it passed the self-check (warned about if its batches are not exact
        enough, or stop being exact past some context length: numerics.py); closed if it did not.
        `params`: the context's llama_context_params, whose settings the warnings' advice names."""
        ftype = int(self._lib.llama_model_ftype(self._model))
        try:
            error = self._self_check(ftype)
        except BaseException:
            self.close()
            raise
        warn_if_inexact(self._lib, error, ftype=ftype, flash_attn_type=int(params.flash_attn_type))
        self.split_attention_from = check_split_attention(self._lib, self._ctx, params, offloaded=offloaded,
                                                          who="LlamaCppVerifier")
        return self

    def _self_check(self, ftype: int) -> float:
        """draftcore.selfcheck.check_tree_attention on this context (model file type `ftype`, which
        sets the tolerance), then an empty sequence.

        In tree mode the check's tree (5 nodes, 2 leaves) tests the sequence-id tagging; in
        chain-only mode the per-branch decodes and their rollback. A tree-mode context with a single
        leaf sequence (n_seq_max=2) verifies chains only, which carry no tags: nothing to check.
        """
        if not self.chain_only and self.max_tree_leaves < 2:
            return 0.0
        if self.max_context < N_POSITIONS or self.max_tree_nodes < 5:
            raise ConfigError(f"self_check: the construction self-check needs n_ctx >= {N_POSITIONS} and "
                              f"max_tree_nodes >= 5, got n_ctx={self.max_context}, max_tree_nodes="
                              f"{self.max_tree_nodes}; pass self_check=False for such a small context")
        tol = self_check_tolerance(self._lib, ftype)
        if self.chain_only:
            name = "LlamaCppVerifier (chain-only)"
            hint = ("Expected each branch decoded in sequence 0 after the cells of the previous one were "
                    "removed (llama_memory_seq_rm)")
        else:
            name = "LlamaCppVerifier (tree mode)"
            hint = ("Expected each node to see only its ancestors, through the sequence ids of the leaves "
                    "below it (kv_unified=True, n_seq_max >= leaves + 1)")
        hint += f"; model file type {ftype}, tolerance {tol:g}. Pass self_check=False at your own risk."
        warned, self._warned = self._warned, True  # the check's own branch decodes are not the user's
        try:
            err = check_tree_attention(self, tol, name=name, hint=hint)
        finally:
            self._warned = warned
            self._clear()
        self.n_decodes = self.n_redecoded = 0
        self.self_check_error = err
        return err

    # ------------------------------------------------------------------ Verifier protocol

    def prefill(self, prompt, n_logits: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Start over from `prompt` (int32[T]); the last position's (int32[1] argmax,
        float32[n_logits, vocab] logits), n_logits 0 or 1 (see draftcore.Verifier.prefill). With
        reuse_prefix, the cells of the prefix shared with the committed tokens (at most T - 1) are
        kept and only the rest is decoded."""
        n_logits = check_n_logits(n_logits, 1)
        if self._ctx is None:
            raise InputError("prefill: this verifier was closed")
        prompt = token_array("prompt", prompt, vocab_size=self.vocab_size)
        if prompt.shape[0] > self.max_context:
            raise InputError(f"prompt: {prompt.shape[0]} tokens exceed max_context {self.max_context} "
                             f"(n_ctx of the llama.cpp context)")
        keep = self._shared_prefix(prompt)
        if keep:
            self._discard_pending()
            self._prefilled = False   # until the rest is decoded: a failure leaves no sequence to verify
            self._seq_rm(-1, keep)
            self.n_past = keep
        else:
            self._clear()
        self.prefix_reused = 0
        self._committed.record(prompt[keep:], keep)   # positions past n_past stay stale if a decode fails
        step = self.limits.n_batch
        for start in range(keep, prompt.shape[0], step):
            chunk = prompt[start:start + step]
            last = start + step >= prompt.shape[0]
            self._batch.set_chain(chunk, start, "last" if last else "none")
            self._decode()
            self.n_past = start + chunk.shape[0]
        self._prefilled = True
        self.prefix_reused = keep
        rows = self._logits(1)
        return rows.argmax(axis=1).astype(np.int32), rows[:n_logits].copy()

    def reset(self) -> None:
        """Forget the sequence: an empty cache, n_past 0 (the next prefill reuses nothing)."""
        if self._ctx is None:
            raise InputError("reset: this verifier was closed")
        self._clear()

    def _shared_prefix(self, prompt: np.ndarray) -> int:
        """How many leading tokens of `prompt` may keep their cells (CommittedTokens); 0 without
        reuse_prefix or a sequence."""
        if not self._reuse_prefix or self.n_past == 0:
            return 0
        return self._committed.shared_prefix(prompt, self.n_past)

    def verify(self, tree: DraftTree, n_logits: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """One forward over `tree` at positions n_past + depths: (int32[n] each node's argmax or -1,
        float32[n_logits, vocab] the first n_logits nodes' logits) (see draftcore.Verifier.verify)."""
        self._check_tree(tree)
        n_logits = check_n_logits(n_logits, len(tree))
        self._discard_pending()
        if tree.is_chain():
            return self._verify_chain(tree, n_logits)
        if self.chain_only:
            self._warn_chain_only()
            return self._verify_by_branches(tree, n_logits)
        return self._verify_tree(tree, n_logits)

    def commit(self, path) -> None:
        """Append the KV of `path` (tree node indices, root first) to sequence 0; free the rest."""
        pending = self._pending
        if pending is None:
            raise InputError("commit: no verified tree is pending (call verify first)")
        path = check_path(path, pending.tree)
        if pending.kind == "tree":
            self._commit_tree(path, pending)
        else:
            self._commit_chain(path, pending)
        self._pending = None
        self._committed.record(pending.tree.tokens[path], self.n_past)
        self.n_past += path.shape[0]

    def advance(self, token) -> int:
        """verify(DraftTree.root_only(token)) then commit([0]), as one call: `token`'s KV appended
        (n_past + 1), and the argmax of its raw logits returned (see draftcore.Verifier's optional
        members). The same llama_decode as that pair's, without the tree protocol's checks and
        bookkeeping: the loop's root-only greedy steps (no draft, or the budget's pause) take this
        path, ~0.12 ms less host time per token on a CPU (0.43 -> 0.31 ms between decodes, docs/llamacpp.md)."""
        if self._ctx is None:
            raise InputError("advance: this verifier was closed")
        token = check_token("token", token, self.vocab_size)
        if not self._prefilled:
            raise InputError("advance: no sequence started (call prefill first)")
        if self.n_past + 1 > self.max_context:
            raise InputError(f"advance: the context holds max_context={self.max_context} tokens, all used "
                             f"(n_past={self.n_past})")
        self._discard_pending()
        self._batch.set_one(token, self.n_past)
        self._decode()
        self._committed.record_one(token, self.n_past)
        self.n_past += 1
        return int(self._logits(1)[0].argmax())

    # ------------------------------------------------------------------ optional text helpers

    def encode(self, text: str, add_special: bool = True) -> np.ndarray:
        """int32 token ids of `text` (special tokens in the text are parsed as such)."""
        if not isinstance(text, str):
            raise InputError(f"text: expected a str, got {describe(text)}")
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (self._lib.llama_token * n_max)()
        n = self._lib.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, True)
        if n < 0:
            raise BackendError(f"llama_tokenize: needed {-n} tokens, buffer held {n_max}")
        return np.ctypeslib.as_array(buf)[:n].astype(np.int32)

    def decode(self, tokens) -> str:
        """Text of `tokens` (int32 ids)."""
        tokens = token_array("tokens", tokens, vocab_size=self.vocab_size, allow_empty=True)
        n_buf = 16 * tokens.shape[0] + 16
        buf = (ctypes.c_char * n_buf)()
        ptr = tokens.ctypes.data_as(ctypes.POINTER(self._lib.llama_token))
        n = self._lib.llama_detokenize(self._vocab, ptr, tokens.shape[0], buf, n_buf, False, False)
        if n < 0:
            raise BackendError(f"llama_detokenize: needed {-n} bytes, buffer held {n_buf}")
        return bytes(buf[:n]).decode("utf-8", errors="replace")

    # ------------------------------------------------------------------ tree mode

    def _verify_tree(self, tree: DraftTree, n_logits: int):
        membership = leaf_membership(tree)            # bool[n, n_leaves]
        n_leaves = membership.shape[1]
        lib, mem = self._lib, self._mem
        # Each leaf sequence must see the context: its cells gain ids 1 .. n_leaves (no copy of KV data).
        for seq in range(1, n_leaves + 1):
            lib.llama_memory_seq_cp(mem, 0, seq, -1, -1)
        # Batch order = cell order: depth-first, best branch first, so the usual accepted path
        # (root -> first child -> ...) occupies the first cells and commits without a hole.
        order = branches.preorder(tree.parents)
        self._pending = _Pending("tree", tree, membership=membership, order=order)
        self._batch.set_tree(tree.tokens[order], tree.depths[order], membership[order], self.n_past)
        self._decode()
        rows = self._logits(len(tree))                # row b is node order[b]
        tokens = np.empty(len(tree), np.int32)
        tokens[order] = rows.argmax(axis=1)
        row_of = np.empty(len(tree), np.int64)
        row_of[order] = np.arange(len(tree))
        return tokens, rows[row_of[:n_logits]]        # fancy indexing copies the rows out

    def _commit_tree(self, path: np.ndarray, pending) -> None:
        # Cells of path nodes carry several leaf ids; rejected cells carry others. Any leaf below the
        # path's last node has the whole path, at positions n_past .. n_past + k - 1 (depths 0..k-1),
        # and deeper nodes after it. Copy a position range of it into seq 0, then drop every cell
        # outside seq 0 and every leaf id from the cells kept.
        # The path's nodes at batch indices 0 .. m - 1 sit in the tree's first m cells, in order: they
        # are kept. A node after a rejected one (a hole) is not: its tail is decoded again after them,
        # into cells that follow, so the cache never holds a later position in an earlier cell.
        k = path.shape[0]
        in_batch = np.empty(len(pending.tree), np.int32)
        in_batch[pending.order] = np.arange(len(pending.tree), dtype=np.int32)
        prefix = in_batch[path] == np.arange(k)
        m = k if prefix.all() else int(np.argmin(prefix))
        leaf = int(np.flatnonzero(pending.membership[path[-1]])[0])
        lib, mem = self._lib, self._mem
        lib.llama_memory_seq_cp(mem, leaf + 1, 0, self.n_past, self.n_past + m)
        lib.llama_memory_seq_keep(mem, 0)
        if m < k:
            rest = pending.tree.tokens[path[m:]]
            self._batch.set_chain(rest, self.n_past + m, "none")
            self._decode()
            self.n_redecoded += rest.shape[0]

    # ------------------------------------------------------------------ chains (both modes)

    def _verify_chain(self, tree: DraftTree, n_logits: int):
        self._pending = _Pending("chain", tree, cached=list(range(len(tree))))
        self._batch.set_chain(tree.tokens, self.n_past, "all")
        self._decode()
        rows = self._logits(len(tree))
        return rows.argmax(axis=1).astype(np.int32), rows[:n_logits].copy()

    def _verify_by_branches(self, tree: DraftTree, n_logits: int):
        """Chain-only mode: decode root paths of `tree` in sequence 0, rolling back between them.

        Decoded: every branch holding one of the first n_logits nodes or a lookahead node (in
        depth-first order, so each starts where the previous one left the cache), then the branches
        greedy acceptance walks into over the candidates (so the cache usually ends on the path that
        will be committed). Nodes of no decoded branch come back as MISSING.
        """
        n, n_walk = len(tree), tree.n_candidates
        first = branches.first_children(tree.parents)
        pending = self._pending = _Pending("chain", tree, cached=[])
        tokens = np.full(n, MISSING, np.int32)
        logits = np.empty((n_logits, self.vocab_size), np.float32)
        read = np.zeros(n, bool)              # nodes whose result a caller reads whatever greedy does
        read[:n_logits] = True
        read[n_walk:] = True
        for head in branches.branch_heads(tree.parents):
            chain = branches.best_chain(first, head)
            if read[chain].any():
                self._decode_root_path(pending, branches.root_path(tree.parents, head) + chain[1:],
                                       tokens, logits)
        # Greedy acceptance over the candidates: decode the branch of each child it moves into.
        if tokens[0] == MISSING:
            self._decode_root_path(pending, branches.best_chain(first, 0), tokens, logits)
        u = 0
        while True:
            child = branches.matching_child(tree.tokens, tree.parents, u, int(tokens[u]), n_walk)
            if child < 0:
                break
            if tokens[child] == MISSING:
                self._decode_root_path(pending, branches.root_path(tree.parents, child)
                                       + branches.best_chain(first, child)[1:], tokens, logits)
            u = child
        return tokens, logits

    def _decode_root_path(self, pending, path: list, tokens: np.ndarray, logits: np.ndarray) -> None:
        """Make the cache hold `path` (root first): keep its common prefix with what is cached,
        decode the rest in one llama_decode, and record the decoded nodes' results."""
        keep = branches.common_prefix(pending.cached, path)
        self._rollback(pending, keep)
        rest = path[keep:]
        if not rest:
            return
        tree = pending.tree
        nodes = np.array(rest, np.int64)
        self._batch.set_chain(tree.tokens[nodes], self.n_past + keep, "all")
        self._decode()
        pending.cached.extend(rest)
        self.n_redecoded += int((tokens[nodes] != MISSING).sum())
        rows = self._logits(len(rest))
        tokens[nodes] = rows.argmax(axis=1)
        wanted = nodes < logits.shape[0]
        logits[nodes[wanted]] = rows[wanted]

    def _commit_chain(self, path: np.ndarray, pending) -> None:
        # The cache holds pending.cached (a root path). Keep its common prefix with `path`; decode
        # the rest of `path` again only if verify ended on another branch.
        keep = branches.common_prefix(pending.cached, path.tolist())
        self._rollback(pending, keep)
        if keep < path.shape[0]:
            rest = pending.tree.tokens[path[keep:]]
            self._batch.set_chain(rest, self.n_past + keep, "none")
            self._decode()
            self.n_redecoded += rest.shape[0]

    def _rollback(self, pending, depth: int) -> None:
        """Drop cached chain cells from position n_past + depth on."""
        if len(pending.cached) > depth:
            self._seq_rm(0, self.n_past + depth)
            del pending.cached[depth:]

    # ------------------------------------------------------------------ llama.cpp calls

    def _decode(self) -> None:
        rc = self._lib.llama_decode(self._ctx, self._batch.raw)
        self.n_decodes += 1
        if rc != 0:
            # rc 1 (no KV slot) and -1 (bad batch) leave the cache as it was; abort and fatal
            # errors may leave some ubatches in it: restore the committed-context invariant.
            self._lib.llama_memory_seq_rm(self._mem, -1, self.n_past, -1)
            self._lib.llama_memory_seq_keep(self._mem, 0)
            self._pending = None
            raise BackendError(f"llama_decode returned {rc} for a batch of {self._batch.raw.n_tokens} "
                               f"tokens at n_past={self.n_past} (1: no free KV cells, -1: invalid batch, "
                               f"2: aborted, < -1: fatal)")

    def _logits(self, n_rows: int) -> np.ndarray:
        """float32[n_rows, vocab] view of llama.cpp's logits buffer (valid until the next decode).

        Rows are the batch's output tokens in batch order. np.frombuffer over a ctypes array at the
        pointer's address is the same zero-copy view as np.ctypeslib.as_array, ~20x cheaper per call.
        """
        ptr = self._lib.llama_get_logits(self._ctx)
        if not ptr:
            raise BackendError("llama_get_logits returned NULL")
        size = n_rows * self.vocab_size
        buf = (ctypes.c_float * size).from_address(ctypes.addressof(ptr.contents))
        return np.frombuffer(buf, np.float32, size).reshape(n_rows, self.vocab_size)

    def _seq_rm(self, seq: int, p0: int) -> None:
        if not self._lib.llama_memory_seq_rm(self._mem, seq, p0, -1):
            raise BackendError(f"llama_memory_seq_rm(seq={seq}, p0={p0}) failed: this memory cannot "
                               f"drop a partial sequence (recurrent models cannot verify drafts)")

    def _clear(self) -> None:
        """An empty cache and no sequence (the Llama, when borrowed, forgets its prefix too)."""
        if self._llm is not None:
            self._llm.reset()
        self._lib.llama_memory_clear(self._mem, False)
        self.n_past, self._pending, self._prefilled, self.prefix_reused = 0, None, False, 0

    def _discard_pending(self) -> None:
        """A second verify without commit: drop the previous tree's cells first."""
        if self._pending is None:
            return
        self._lib.llama_memory_seq_rm(self._mem, -1, self.n_past, -1)
        self._lib.llama_memory_seq_keep(self._mem, 0)
        self._pending = None

    # ------------------------------------------------------------------ checks (before any state changes)

    def _check_tree(self, tree) -> None:
        check_tree(tree, self.vocab_size)
        if not self._prefilled:
            raise InputError("verify: no sequence started (call prefill first)")
        n = len(tree)
        if self.n_past + n > self.max_context:
            raise InputError(f"tree: {n} nodes after n_past={self.n_past} need {self.n_past + n} KV cells, "
                             f"more than max_context {self.max_context}")
        if n > self.max_tree_nodes:
            raise InputError(f"tree: {n} nodes exceed max_tree_nodes {self.max_tree_nodes} (n_batch "
                             f"{self.limits.n_batch}: the most tokens one llama_decode takes); draft fewer "
                             f"nodes, or raise n_batch")
        if self.max_tree_leaves is not None and not tree.is_chain():
            n_leaves = tree.leaves().shape[0]
            if n_leaves > self.max_tree_leaves:
                raise InputError(f"tree: {n_leaves} leaves, but this context has n_seq_max="
                                 f"{self.limits.n_seq_max} (at most {self.max_tree_leaves} leaves); "
                                 f"create the verifier with n_seq_max >= {n_leaves + 1}")

    def _warn_chain_only(self) -> None:
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"LlamaCppVerifier: this llama.cpp context cannot hold a draft tree (n_seq_max="
            f"{self.limits.n_seq_max}, kv_unified={self.limits.unified}); branching trees are verified "
            f"branch by branch, with one llama_decode per branch taken. For one decode per tree use "
            f"LlamaCppVerifier.from_llama(llm, own_context=True) or from_gguf(path). (chain_only=True)",
            ChainOnlyWarning, stacklevel=3)


# The self-check's context next to a serving Llama (llama_batch_error): the check decodes
# selfcheck.N_POSITIONS positions in batches of at most 5 tokens, so 256 cells (llama.cpp rounds n_ctx
# up to a multiple of 256 anyway) and 16-token batches hold it, with a KV cache and compute buffers
# that stay small whatever the Llama's n_ctx and n_batch. The Llama's n_ubatch is kept (up to 16):
# it, not n_batch, sets how many tokens one graph evaluation computes together.
CHECK_CONTEXT_CELLS = 256
CHECK_BATCH = 16


def llama_batch_error(llm) -> float:
    """The construction self-check's relative error (as `self_check_error`) for the contexts of
    `llm`, a llama_cpp.Llama, measured on a small context of its own over llm's loaded weights.

    The check's context copies llm's context settings (threads, KV types, flash attention, n_ubatch up
    to CHECK_BATCH) and, like llm's, holds one sequence: chains are decoded in it (chain-only mode) as
    llama-cpp-python's speculative loop decodes them. llm's own KV cache and state are not touched (a
    check there would drop the prefix its next call reuses); the check's context is freed before this
    returns. BackendError where batches are off by more than the tolerance.
    """
    lib = import_llama_cpp()
    params = tree_context_params(lib, llm.context_params, n_ctx=CHECK_CONTEXT_CELLS, n_seq_max=1)
    params.n_batch = CHECK_BATCH
    params.n_ubatch = min(params.n_ubatch, CHECK_BATCH)
    ctx = new_context(lib, llm.model, params)
    verifier = LlamaCppVerifier(lib, llm.model, ctx, read_limits(lib, ctx), keepalive=(_Owner(lib, None, ctx), llm),
                                offloaded=offloads_layers(lib, llm.model_params.n_gpu_layers))
    try:
        return verifier._self_check(int(lib.llama_model_ftype(llm.model)))
    finally:
        verifier.close()


class _Pending:
    """What the last verify left in the KV cache."""

    def __init__(self, kind: str, tree: DraftTree, cached=None, membership=None, order=None):
        self.kind = kind              # "tree": leaf sequences; "chain": a root path in seq 0
        self.tree = tree
        self.cached = cached          # chain: node indices at positions n_past, n_past + 1, ...
        self.membership = membership  # tree: bool[n, n_leaves]
        self.order = order            # tree: int32[n], the node in each batch row (= cell order)


class _Owner:
    """Frees a context (and model) this adapter created, once, at close() or garbage collection."""

    def __init__(self, lib, model, ctx):
        self._finalize = weakref.finalize(self, _free, lib, model, ctx)

    def close(self) -> None:
        self._finalize()


def _free(lib, model, ctx) -> None:
    lib.llama_free(ctx)
    if model is not None:
        lib.llama_model_free(model)


# The construction self-check's bound on max |tree - one-token| / max(1, max |one-token|), by weight
# type. Measured on CPU (llama-cpp-python 0.3.36, the check's tree with prompt seeds 0-3, flash
# attention off and on, tree mode and chain-only): correct contexts reach 2.7e-4 (tiny random Llama,
# F32), 5e-4 / 2e-3 / 1.1e-2 (SmolLM2-135M F32 / F16 / BF16), and on quantized SmolLM2 with flash
# attention off 0.010 (Q8_0), 0.039 (Q4_1), 0.044 (Q5_0), 0.058 (Q4_K_M); flash on gives 0 except
# 0.039 (Q4_K_M). A batch that lets every node see its cousins is off by >= 0.18 on all of them
# (>= 0.26 on every SmolLM2 type but Q2_K's 0.18). GPU kernels were not measured.
FLOAT_WEIGHTS_TOLERANCE = 0.05       # 5x the worst correct float forward (BF16), 4x under a broken one
QUANTIZED_WEIGHTS_TOLERANCE = 0.1    # between the worst correct (0.058) and broken (0.18) quantized


def self_check_tolerance(lib, ftype: int) -> float:
    """The self-check's tolerance for a model whose GGUF file type is `ftype` (llama_model_ftype)."""
    if is_float_weights(lib, ftype):
        return FLOAT_WEIGHTS_TOLERANCE
    return QUANTIZED_WEIGHTS_TOLERANCE
