"""Validation at the Verifier boundary, written once: the loop and every adapter call these.

    check_tree(tree, vocab_size)          a DraftTree a backend may index embeddings with and build masks from
                                          (defined with the tree, draftcore.tree)
    check_n_logits(n_logits, tree)        how many leading rows of logits a verify returns
    check_path(path, tree)                a root-first parent chain of the last verified tree
    check_token(name, token, vocab_size)  one token id (Verifier.advance's argument and result)
    check_observation(tree, tokens, path) what a drafter's observe() is given (a caller may call it too)
    check_node_results(...)               what a verifier returned (the loop's check of a backend)
    VerifierLimits.of(capabilities)       the protocol's attributes, the optional ones included

Input from a caller is refused with `InputError` before any state changes; output from a backend
that breaks the protocol is a `BackendError`. Every message names the argument, the value and what
was expected. Tree and path invariants are one pass of a numba kernel (draftcore.tree_kernels): they run on every
verify and commit, where a dozen small numpy calls cost more than the check itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .errors import BackendError, InputError, describe
from .jit import kernels
from .tree import DraftTree, check_tree  # noqa: F401 (check_tree: the boundary checks in one place)
from .validate import positive_int

if TYPE_CHECKING:
    from .capabilities import VerifierCapabilities

MISSING = -1  # a node's token when the backend did not evaluate that node (see Verifier.verify)


def check_n_logits(n_logits, n_nodes: int) -> int:
    """`n_logits` as an int in [0, n_nodes] (the leading rows whose logits a call returns), or InputError."""
    if isinstance(n_logits, bool) or not isinstance(n_logits, (int, np.integer)) or not 0 <= n_logits <= n_nodes:
        raise InputError(f"n_logits: expected an int in [0, {n_nodes}] (rows of logits to return for a "
                         f"{n_nodes}-node call), got {describe(n_logits)}")
    return int(n_logits)


def check_token(name: str, token, vocab_size: int, error=InputError) -> int:
    """`token` as an int id in [0, vocab_size), or `error` naming `name` (one token, checked in
    Python: a numpy reduction would cost more than the one-token step it guards)."""
    if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= token < vocab_size:
        raise error(f"{name}: expected a token id in [0, {vocab_size}), got {describe(token)}")
    return int(token)


def check_path(path, tree: DraftTree) -> np.ndarray:
    """int32[k]: `path` as a root-first parent chain of `tree` (node indices), or InputError."""
    arr = np.asarray(path) if not isinstance(path, np.ndarray) else path
    if arr.ndim != 1 or arr.shape[0] == 0 or arr.dtype.kind not in "iu":
        raise InputError(f"path: expected a non-empty 1-D int32 array of tree node indices, got {describe(path)}")
    i = kernels("draftcore.tree_kernels").path_error(arr.astype(np.int64, copy=False), tree.parents)
    if i >= 0:
        n, node = len(tree), int(arr[i])
        if not 0 <= node < n:
            raise InputError(f"path: node indices must lie in [0, {n}) for the last verified tree, got {arr.tolist()}")
        if i == 0:
            raise InputError(f"path: must start at the root (node 0), got {arr.tolist()}")
        raise InputError(f"path: node {node} at path[{i}] is not a child of path[{i - 1}] = {int(arr[i - 1])} "
                         f"(its parent is {int(tree.parents[node])}); expected a root-first parent chain, "
                         f"got {arr.tolist()}")
    return np.ascontiguousarray(arr, dtype=np.int32)


def check_observation(tree, node_tokens, path) -> tuple[np.ndarray, np.ndarray]:
    """(node_tokens int32[n], path int32[k]) for `DraftRequest.observe(tree, node_tokens, path)`, or
    InputError: a well-formed tree (its parents index the drafters' kernels, which do not check
    bounds), the model's token or MISSING at each of its n nodes, and a root-first parent chain of it.
    About 8 µs a call (SmolLM2-sized trees, this 2-core CPU); observe runs once per step."""
    check_tree(tree)
    n = tree.tokens.shape[0]
    tokens = node_tokens if isinstance(node_tokens, np.ndarray) else np.asarray(node_tokens)
    upper = np.iinfo(np.int32).max
    expected = (f"expected int32[{n}] (the model's token in [0, {upper}) at each node of the tree, "
                f"{MISSING} where not evaluated)")
    if tokens.shape != (n,) or tokens.dtype.kind not in "iu":
        raise InputError(f"node_tokens: {expected}, got {describe(node_tokens)}")
    low, high = int(tokens.min()), int(tokens.max())
    if low < MISSING or high >= upper:
        raise InputError(f"node_tokens: {expected}, got a value {low if low < MISSING else high}")
    return np.ascontiguousarray(tokens, np.int32), check_path(path, tree)


def check_node_results(result, n_nodes: int, n_logits: int, vocab_size: int, where: str):
    """(tokens int32[n_nodes], logits float32[n_logits, vocab_size]) from what a verifier's
    `prefill` or `verify` returned, or BackendError naming `where` and what is wrong.

    tokens[i] is the argmax of node i's raw logits, or MISSING (-1) for a node the backend did not
    evaluate; the root and the first n_logits nodes must be evaluated. Logits may hold -inf (a masked token),
    never NaN or +inf, and every row needs a finite entry.
    """
    if not isinstance(result, tuple) or len(result) != 2:
        raise BackendError(f"{where}: expected a tuple (tokens int32[{n_nodes}], logits float32[{n_logits}, "
                           f"{vocab_size}]), got {describe(result)}")
    tokens, logits = result
    if not isinstance(tokens, np.ndarray) or tokens.shape != (n_nodes,) or tokens.dtype.kind not in "iu":
        raise BackendError(f"{where}: expected tokens int32[{n_nodes}], got {describe(tokens)}")
    if tokens.min() < MISSING or tokens.max() >= vocab_size or tokens[:max(1, n_logits)].min() < 0:
        raise BackendError(f"{where}: token outside [0, {vocab_size}) (or -1 for a node not evaluated, never "
                           f"the root nor one of the first {n_logits} nodes, whose logits were asked for): "
                           f"{tokens.tolist()}")
    if (not isinstance(logits, np.ndarray) or logits.shape != (n_logits, vocab_size)
            or logits.dtype.kind != "f"):
        raise BackendError(f"{where}: expected logits float32[{n_logits}, {vocab_size}], got {describe(logits)}")
    if n_logits and not np.isfinite(logits.max(axis=1)).all():
        # one reduction: NaN, +inf and an all -inf row all show in the row maxima
        raise BackendError(f"{where}: logits contain NaN or +inf, or a row with no finite logit")
    return np.ascontiguousarray(tokens, np.int32), logits   # contiguous: drafters' kernels take C arrays


@dataclass(frozen=True)
class VerifierLimits:
    """What one verify may hold, from the Verifier protocol's attributes (validated once per call).

    vocab_size, max_context: required attributes. max_tree_nodes (optional attribute): the most
    nodes one verify takes, else max_context. max_tree_leaves (optional): the most leaves one tree
    may have (llama.cpp: one sequence id per leaf), else no limit.
    """

    vocab_size: int
    max_context: int
    max_tree_nodes: int
    max_tree_leaves: int | None

    @staticmethod
    def of(verifier: "VerifierCapabilities") -> "VerifierLimits":
        """From a verifier's capabilities (`draftcore.capabilities`, where its attributes are read)."""
        vocab_size = positive_int("verifier.vocab_size", verifier.vocab_size)
        max_context = positive_int("verifier.max_context", verifier.max_context)
        nodes = verifier.max_tree_nodes
        nodes = max_context if nodes is None else positive_int("verifier.max_tree_nodes", nodes)
        leaves = verifier.max_tree_leaves
        leaves = None if leaves is None else positive_int("verifier.max_tree_leaves", leaves)
        return VerifierLimits(vocab_size, max_context, nodes, leaves)
