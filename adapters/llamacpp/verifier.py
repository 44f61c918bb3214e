"""LlamaCppVerifier: the draftcore Verifier over a llama.cpp context (GPU offload or CPU).

Two modes, chosen from what the context can do (context.py) and reported by `chain_only`:

- tree mode (kv_unified, n_seq_max >= leaves + 1): ONE llama_decode per draft tree. Node i sits at
  position n_past + depth[i] with the sequence ids of the leaves below it (batch.py); commit keeps the
  accepted path as sequence 0 and frees every other cell with two sequence operations.
- chain-only mode (a stock `llama_cpp.Llama`: one sequence, no unified cache): a chain draft is still
  one llama_decode; a branching tree is verified branch by branch (branches.py), each extra decode
  announced once with a ChainOnlyWarning. Never silently slow.

KV cache invariants between calls (checked by the tests):

    seq 0 holds exactly the committed tokens, at positions 0 .. n_past - 1, and no other cells exist.
    After verify: the tree's cells exist (tree mode: tagged with leaf seqs; chain: in seq 0),
    and commit(path) restores the invariant with n_past += len(path).
    Cells hold positions in increasing order: CPU flash attention sums over cells in cell order, so
    a cache whose cells were reordered gives other logits (up to 0.7 on Q4_1 SmolLM2) than plain
    decoding. A tree batch therefore goes in depth-first order, best branch first, and a commit
    whose path is not a prefix of the batch decodes the path's tail again (n_redecoded; README.md).

The llama.cpp logits buffer is read through a numpy view (no per-element Python): argmax is taken in
place; want="logits" copies rows out, since the next llama_decode overwrites the buffer.
"""
from __future__ import annotations

import ctypes
import warnings
import weakref

import numpy as np

from draftcore.errors import BackendError, ConfigError, InputError, describe
from draftcore.tree import DraftTree, _first_bad_node
from draftcore.validate import positive_int, token_array

from . import branches
from .batch import Batch
from .context import (Limits, default_threads, import_llama_cpp, load_model, new_context, read_limits,
                      split_overrides, tree_context_params)

DEFAULT_SEQ_MAX = 64  # a tree of n >= 2 nodes has at most n - 1 leaves: trees up to 64 nodes


class ChainOnlyWarning(UserWarning):
    """A branching draft tree is verified with several llama_decode calls (context cannot hold a tree)."""


class LlamaCppVerifier:
    """Verifier over a llama.cpp context. Build with `from_gguf` or `from_llama`.

    Attributes:
        vocab_size:  logits per position.
        n_past:      committed tokens in the KV cache (sequence 0).
        max_context: n_ctx, the cells of the KV cache; prompt + generated + one tree must fit.
        chain_only:  True when trees are verified branch by branch (see ChainOnlyWarning).
        max_leaves:  leaves a tree may have in tree mode (0 in chain-only mode).
        max_tree_nodes: the most nodes one verify takes (n_batch, and in tree mode max_leaves + 1,
                     since a tree of n nodes has at most n - 1 leaves); speculate drafts no more.
        n_decodes:   llama_decode calls so far; n_redecoded: tokens decoded again by commit
                     (a path that left the best branch, or chain-only mode's logits walk).
    """

    def __init__(self, lib, model, ctx, limits: Limits, *, keepalive=(), llm=None):
        """Internal: use `from_gguf` / `from_llama`. `keepalive` holds whatever owns model/ctx."""
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
        self.max_leaves = limits.max_leaves
        self.chain_only = self.max_leaves == 0
        self.max_tree_nodes = limits.n_batch if self.chain_only else min(limits.n_batch, self.max_leaves + 1)
        self.n_past = 0
        self.n_decodes = 0
        self.n_redecoded = 0
        self._batch = Batch(lib, limits.n_batch, max(1, limits.n_seq_max))
        self._pending = None      # what the last verify left in the cache, until commit
        self._prefilled = False
        self._warned = False

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_gguf(cls, path, *, n_ctx: int = 4096, n_batch: int = 512, n_gpu_layers: int = 0,
                  n_threads: int | None = None, n_seq_max: int = DEFAULT_SEQ_MAX, type_k: int | None = None,
                  type_v: int | None = None, flash_attn: bool | None = None, verbose: bool = False,
                  **llama_kwargs) -> "LlamaCppVerifier":
        """Load a GGUF model into a tree-capable context (kv_unified=True, n_seq_max sequences).

        n_threads:   CPU threads (default: the cores this process may use).
        type_k/v:    KV cache ggml types (e.g. llama_cpp.GGML_TYPE_F32 for exactness tests).
        flash_attn:  True / False, or None for llama.cpp's automatic choice.
        llama_kwargs: any other llama_context_params / llama_model_params field by name.
        """
        lib = import_llama_cpp()
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
        return cls(lib, model, ctx, read_limits(lib, ctx), keepalive=(owner,))

    @classmethod
    def from_llama(cls, llm, *, strict: bool = False, own_context: bool = False,
                   n_seq_max: int = DEFAULT_SEQ_MAX) -> "LlamaCppVerifier":
        """Verify with an existing `llama_cpp.Llama`, whose settings are left as they are.

        By default its own context is used. A stock Llama has one sequence and a split cache, so
        branching trees are then verified branch by branch (chain_only; warned once). Instead:
          strict=True       raise ConfigError naming the settings a tree needs;
          own_context=True  make a second context over the same loaded weights with tree settings
                            (its n_ctx, n_batch, threads and KV types, plus kv_unified and n_seq_max):
                            one llama_decode per tree, at the cost of one more KV cache.
        The verifier drives the context directly and calls `llm.reset()` at each prefill, so the
        Llama never reuses a KV prefix it no longer holds.
        """
        lib = import_llama_cpp()
        if not isinstance(llm, lib.Llama):
            raise ConfigError(f"llm: expected a llama_cpp.Llama, got {describe(llm)}")
        if own_context:
            n_seq_max = positive_int("n_seq_max", n_seq_max, minimum=2)
            params = tree_context_params(lib, llm.context_params, n_seq_max=n_seq_max)
            ctx = new_context(lib, llm.model, params)
            owner = _Owner(lib, None, ctx)
            return cls(lib, llm.model, ctx, read_limits(lib, ctx), keepalive=(owner, llm))
        limits = read_limits(lib, llm.ctx)
        if limits.max_leaves == 0 and strict:
            raise ConfigError(
                f"llm: its context cannot hold a draft tree (n_seq_max={limits.n_seq_max}, "
                f"kv_unified={limits.unified}); a tree of L leaves needs kv_unified=True and "
                f"n_seq_max >= L + 1 (e.g. n_seq_max={DEFAULT_SEQ_MAX} for trees of up to "
                f"{DEFAULT_SEQ_MAX} nodes). llama_cpp.Llama() cannot set these: use "
                f"LlamaCppVerifier.from_llama(llm, own_context=True) or "
                f"LlamaCppVerifier.from_gguf(path, n_seq_max={DEFAULT_SEQ_MAX})")
        return cls(lib, llm.model, llm.ctx, limits, keepalive=(llm,), llm=llm)

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

    # ------------------------------------------------------------------ Verifier protocol

    def prefill(self, prompt, want: str = "argmax"):
        """Start over from `prompt` (int32[T]); the result for its last position (see Verifier)."""
        want = _check_want(want)
        if self._ctx is None:
            raise InputError("prefill: this verifier was closed")
        prompt = token_array("prompt", prompt, vocab_size=self.vocab_size)
        if prompt.shape[0] > self.max_context:
            raise InputError(f"prompt: {prompt.shape[0]} tokens exceed max_context {self.max_context} "
                             f"(n_ctx of the llama.cpp context)")
        if self._llm is not None:
            self._llm.reset()
        self._lib.llama_memory_clear(self._mem, False)
        self.n_past, self._pending, self._prefilled = 0, None, False
        step = self.limits.n_batch
        for start in range(0, prompt.shape[0], step):
            chunk = prompt[start:start + step]
            last = start + step >= prompt.shape[0]
            self._batch.set_chain(chunk, start, "last" if last else "none")
            self._decode()
            self.n_past = start + chunk.shape[0]
        self._prefilled = True
        row = self._logits(1)[0]
        return int(row.argmax()) if want == "argmax" else row.copy()

    def verify(self, tree: DraftTree, want: str = "argmax") -> np.ndarray:
        """One forward over `tree` at positions n_past + depths (see Verifier.verify)."""
        want = _check_want(want)
        self._check_tree(tree)
        self._discard_pending()
        if tree.is_chain():
            return self._verify_chain(tree, want)
        if self.chain_only:
            self._warn_chain_only(tree)
            return self._verify_by_branches(tree, want)
        return self._verify_tree(tree, want)

    def commit(self, path) -> None:
        """Append the KV of `path` (tree node indices, root first) to sequence 0; free the rest."""
        pending = self._pending
        if pending is None:
            raise InputError("commit: no verified tree is pending (call verify first)")
        path = self._check_path(path, pending.tree)
        if pending.kind == "tree":
            self._commit_tree(path, pending)
        else:
            self._commit_chain(path, pending)
        self._pending = None
        self.n_past += path.shape[0]

    # ------------------------------------------------------------------ optional text helpers

    def encode(self, text: str, add_special: bool = True) -> np.ndarray:
        """int32 token ids of `text` (special tokens in the text are parsed as such)."""
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

    def _verify_tree(self, tree: DraftTree, want: str) -> np.ndarray:
        membership = tree.leaf_membership()           # bool[n, n_leaves]
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
        return self._result(len(tree), want, order)

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

    def _verify_chain(self, tree: DraftTree, want: str) -> np.ndarray:
        self._pending = _Pending("chain", tree, cached=list(range(len(tree))))
        self._batch.set_chain(tree.tokens, self.n_past, "all")
        self._decode()
        return self._result(len(tree), want)

    def _verify_by_branches(self, tree: DraftTree, want: str) -> np.ndarray:
        """Chain-only mode: decode branch chains in sequence 0, rolling back between them.

        want="argmax": only the branches greedy acceptance walks into (one decode when it stays on
        the best branch). Entries of nodes never decoded are 0: greedy acceptance cannot reach them.
        want="logits": every branch, each node decoded once (a sampler may walk anywhere).
        """
        n = len(tree)
        first = branches.first_children(tree.parents)
        pending = self._pending = _Pending("chain", tree, cached=[])
        out = np.zeros(n, np.int32) if want == "argmax" else np.empty((n, self.vocab_size), np.float32)
        heads = [0] if want == "argmax" else branches.branch_heads(tree.parents)
        while heads:
            head = heads.pop(0)
            chain = branches.best_chain(first, head)
            self._rollback(pending, int(tree.depths[head]))
            self._batch.set_chain(tree.tokens[chain], self.n_past + int(tree.depths[head]), "all")
            self._decode()
            pending.cached.extend(chain)
            out[chain] = self._result(len(chain), want)
            if want == "argmax":
                off = _greedy_exit(tree, out, chain)
                if off >= 0:
                    heads.append(off)
        return out

    def _commit_chain(self, path: np.ndarray, pending) -> None:
        # The cache holds pending.cached (a root path). Keep its common prefix with `path`; decode
        # the rest of `path` again only if verify ended on another branch (chain-only logits mode).
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

    def _result(self, n_rows: int, want: str, order=None) -> np.ndarray:
        """Per-node results from the batch's rows; `order[b]` is the node in batch row b (None: same)."""
        logits = self._logits(n_rows)
        rows = logits.argmax(axis=1).astype(np.int32) if want == "argmax" else logits
        if order is None:
            return rows if want == "argmax" else rows.copy()
        out = np.empty_like(rows)
        out[order] = rows
        return out

    def _seq_rm(self, seq: int, p0: int) -> None:
        if not self._lib.llama_memory_seq_rm(self._mem, seq, p0, -1):
            raise BackendError(f"llama_memory_seq_rm(seq={seq}, p0={p0}) failed: this memory cannot "
                               f"drop a partial sequence (recurrent models cannot verify drafts)")

    def _discard_pending(self) -> None:
        """A second verify without commit: drop the previous tree's cells first."""
        if self._pending is None:
            return
        self._lib.llama_memory_seq_rm(self._mem, -1, self.n_past, -1)
        self._lib.llama_memory_seq_keep(self._mem, 0)
        self._pending = None

    # ------------------------------------------------------------------ checks (before any state changes)

    def _check_tree(self, tree) -> None:
        if not isinstance(tree, DraftTree):
            raise InputError(f"tree: expected a DraftTree, got {describe(tree)}")
        if not self._prefilled:
            raise InputError("verify: no sequence started (call prefill first)")
        n = len(tree)
        if (n == 0 or tree.parents.shape != (n,) or tree.depths.shape != (n,)
                or tree.parents.dtype != np.int32 or tree.depths.dtype != np.int32
                or _first_bad_node(tree.parents, tree.depths) >= 0):
            raise InputError(f"tree: malformed (build it with DraftTree.build): {tree!r}")
        if self.n_past + n > self.max_context:
            raise InputError(f"tree: {n} nodes after n_past={self.n_past} need {self.n_past + n} KV cells, "
                             f"more than max_context {self.max_context}")
        if tree.tokens.dtype != np.int32 or tree.tokens.min() < 0 or tree.tokens.max() >= self.vocab_size:
            raise InputError(f"tree.tokens: expected int32 ids in [0, {self.vocab_size}), got "
                             f"{describe(tree.tokens)} with range [{tree.tokens.min()}, {tree.tokens.max()}]")
        # One batch holds the whole tree, or in chain-only mode its longest branch.
        self._check_batch(int(tree.depths.max()) + 1 if self.chain_only else n)
        if not self.chain_only and not tree.is_chain():
            n_leaves = tree.leaves().shape[0]
            if n_leaves > self.max_leaves:
                raise InputError(f"tree: {n_leaves} leaves, but this context has n_seq_max="
                                 f"{self.limits.n_seq_max} (at most {self.max_leaves} leaves); "
                                 f"create the verifier with n_seq_max >= {n_leaves + 1}")

    def _check_batch(self, n: int) -> None:
        if n > self.limits.n_batch:
            raise InputError(f"tree: {n} nodes exceed n_batch {self.limits.n_batch}, the most tokens one "
                             f"llama_decode takes; draft fewer nodes or raise n_batch")

    @staticmethod
    def _check_path(path, tree: DraftTree) -> np.ndarray:
        path = token_array("path", path)
        if path.max() >= len(tree):
            raise InputError(f"path: node index {int(path.max())} is outside the tree of {len(tree)} nodes")
        if path[0] != 0:
            raise InputError(f"path: expected to start at the root (node 0), got node {int(path[0])}")
        if path.shape[0] > 1 and not np.array_equal(tree.parents[path[1:]], path[:-1]):
            raise InputError(f"path: {path.tolist()} is not a root-to-node path of the tree "
                             f"(parents {tree.parents[path].tolist()})")
        return path

    def _warn_chain_only(self, tree: DraftTree) -> None:
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"LlamaCppVerifier: this llama.cpp context cannot hold a draft tree (n_seq_max="
            f"{self.limits.n_seq_max}, kv_unified={self.limits.unified}); branching trees are verified "
            f"branch by branch, with one llama_decode per branch taken. For one decode per tree use "
            f"LlamaCppVerifier.from_llama(llm, own_context=True) or from_gguf(path). (chain_only=True)",
            ChainOnlyWarning, stacklevel=3)


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


def _greedy_exit(tree: DraftTree, out: np.ndarray, chain: list) -> int:
    """Walk greedy acceptance along a freshly decoded chain; return the off-chain child it moves
    into (whose branch must be decoded next), or -1 if the walk ends on this chain."""
    for j, u in enumerate(chain):
        child = branches.matching_child(tree.tokens, tree.parents, u, int(out[u]))
        if child < 0:
            return -1
        if j + 1 >= len(chain) or chain[j + 1] != child:
            return child
    return -1


def _check_want(want) -> str:
    if want not in ("argmax", "logits"):
        raise InputError(f"want: expected 'argmax' or 'logits', got {describe(want)}")
    return want
