"""The speculative decoding loop (DESIGN.md "The loop"), greedy or sampled, streaming or not.

One loop for every acceptance rule (`draftcore.sampling`): greedy asks the verifier for the argmax
per node; sampling (and greedy with penalties) asks for logits, processes each node's row for its
own prefix and accepts exactly.
"""
from __future__ import annotations

import time
from typing import Iterator, Sequence

import numpy as np

from .budget import as_budget_policy
from .errors import BackendError, InputError, describe
from .result import SpeculateResult, SpeculateStats
from .sampling import SamplingParams, as_sampling_params, make_rule
from .tree import DraftTree
from .validate import positive_int, token_array

DEFAULT_BUDGET = 16


def speculate(verifier, prompt, *, max_new_tokens: int = 128, drafter=None, budget=DEFAULT_BUDGET,
              eos_token_id=None, stop_sequences: Sequence[Sequence[int]] = (),
              sampling: SamplingParams | dict | None = None) -> SpeculateResult:
    """Generate up to `max_new_tokens` tokens after `prompt`, exactly as plain decoding with
    `verifier` would, drafting with `drafter` (a fresh `TrieDrafter` when None): token for token
    when greedy, with the same distribution over sequences when sampling.

    prompt: int32 token ids, or a string when the verifier has `encode`.
    budget: drafted nodes verified per step: an int (fixed), "auto" (a `CostAwareBudget`: the tree
        size that maximises expected tokens per second, measured as it runs; one per verifier,
        kept across calls, `draftcore.budget.auto_budget(verifier)`), or a budget policy object.
    eos_token_id: an id or a collection of ids that end generation (kept in the output).
    stop_sequences: token-id sequences that end generation once generated (kept in the output).
    sampling: None (greedy, the default), a `SamplingParams`, or a dict of its fields with
        transformers' names: temperature, top_k, top_p, min_p, repetition_penalty,
        presence_penalty, frequency_penalty, do_sample, seed. `result.seed` replays the run.
    """
    stream = speculate_stream(verifier, prompt, max_new_tokens=max_new_tokens, drafter=drafter,
                              budget=budget, eos_token_id=eos_token_id, stop_sequences=stop_sequences,
                              sampling=sampling)
    for _ in stream:
        pass
    return stream.result


class SpeculationStream:
    """Iterates over int32 arrays of newly accepted tokens; `.result` is set once exhausted."""

    def __init__(self, generator: Iterator[np.ndarray]):
        self._generator = generator
        self.result: SpeculateResult | None = None

    def __iter__(self):
        result = yield from self._generator
        if result is not None:  # a second iteration finds the generator exhausted: keep the result
            self.result = result
        return self.result


def speculate_stream(verifier, prompt, *, max_new_tokens: int = 128, drafter=None,
                     budget=DEFAULT_BUDGET, eos_token_id=None,
                     stop_sequences: Sequence[Sequence[int]] = (),
                     sampling: SamplingParams | dict | None = None) -> SpeculationStream:
    """Streaming twin of `speculate`: iterate to receive tokens as they are accepted.

    Every argument is validated here, before any verifier or drafter state changes.
    """
    was_text = isinstance(prompt, str)
    if was_text:
        if not hasattr(verifier, "encode"):
            raise InputError(f"prompt: got text, but {type(verifier).__name__} has no encode(); pass int32 token ids")
        prompt = verifier.encode(prompt)
    vocab_size = positive_int("verifier.vocab_size", getattr(verifier, "vocab_size", None))
    prompt = token_array("prompt", prompt, vocab_size=vocab_size)
    max_new_tokens = positive_int("max_new_tokens", max_new_tokens)
    max_context = positive_int("verifier.max_context", getattr(verifier, "max_context", None))
    if prompt.shape[0] + max_new_tokens > max_context:
        raise InputError(
            f"max_new_tokens: prompt ({prompt.shape[0]} tokens) + max_new_tokens ({max_new_tokens}) = "
            f"{prompt.shape[0] + max_new_tokens} exceeds the verifier's max_context {max_context}")
    eos_ids = _eos_ids(eos_token_id, vocab_size)
    stops = [token_array(f"stop_sequences[{i}]", s, vocab_size) for i, s in enumerate(stop_sequences)]
    policy = as_budget_policy(budget, verifier)
    limit = getattr(verifier, "max_tree_nodes", None)
    max_tree_nodes = max_context if limit is None else positive_int("verifier.max_tree_nodes", limit)
    rule = make_rule(as_sampling_params(sampling), vocab_size)
    if drafter is None:
        from .drafters.trie import TrieDrafter
        drafter = TrieDrafter()
    generator = _decode(verifier, prompt, max_new_tokens, max_tree_nodes, drafter, policy, rule, eos_ids, stops,
                        was_text)
    return SpeculationStream(generator)


def _eos_ids(eos_token_id, vocab_size) -> np.ndarray:
    if eos_token_id is None:
        return np.zeros(0, np.int32)
    if isinstance(eos_token_id, (int, np.integer)):
        eos_token_id = [eos_token_id]
    try:
        ids = list(eos_token_id)
    except TypeError:
        raise InputError(f"eos_token_id: expected an int token id or a collection of them, got {describe(eos_token_id)}") from None
    return token_array("eos_token_id", ids, vocab_size, allow_empty=True)


def _decode(verifier, prompt, max_new_tokens, max_tree_nodes, drafter, policy, rule, eos_ids, stops, was_text):
    stats = SpeculateStats()
    n_prompt = prompt.shape[0]
    context = np.empty(n_prompt + max_new_tokens, np.int32)  # prompt + generated; grows in place
    context[:n_prompt] = prompt
    n_context = n_prompt
    t_start = time.perf_counter()

    # draftcore's own drafters are trusted to return well-formed trees; anything else is checked.
    trusted = getattr(drafter, "returns_valid_trees", False) is True
    drafter.start(prompt)
    rule.start(prompt)
    try:
        first = rule.first(verifier.prefill(prompt, rule.want))
        stats.time_prefill = time.perf_counter() - t_start
        stats.steps = 1
        emitted = np.array([first], np.int32)
        while True:
            emitted, stop_reason = _apply_stops(emitted, context, n_context, n_prompt, max_new_tokens,
                                                eos_ids, stops)
            context[n_context:n_context + emitted.shape[0]] = emitted
            n_context += emitted.shape[0]
            stats.new_tokens = n_context - n_prompt
            yield emitted
            if stop_reason is not None:
                break
            rule.update(emitted)
            t0 = time.perf_counter()
            drafter.update(emitted)

            # The root (context[-1]) is accepted but not in the KV cache yet.
            room = min(max_new_tokens - stats.new_tokens - 1,            # tokens still wanted
                       verifier.max_context - verifier.n_past - 1,       # cache cells left
                       max_tree_nodes - 1)                               # what one verify takes
            request = min(policy.request_size(), room)
            if request > 0:
                tree = drafter.propose(context[:n_context], request)
                if not trusted:
                    _check_tree(tree, context[n_context - 1], request, verifier.vocab_size)
                keep = policy.choose(tree)
                if keep < tree.n_draft:
                    tree = tree.truncated(1 + keep)
            else:
                tree = DraftTree.root_only(int(context[n_context - 1]))
            t1 = time.perf_counter()
            out = verifier.verify(tree, rule.want)
            t2 = time.perf_counter()
            path, next_token = rule.accept(tree, out)
            verifier.commit(path)
            t3 = time.perf_counter()

            n_accepted = path.shape[0] - 1
            # The whole step is the price of this tree size, not the verify alone: drafting, and a
            # commit that leaves the backend's preferred branch (llama.cpp re-decodes the path's
            # tail) grow with the tree, and a fixed per-step host cost weighs more on a fast GPU.
            policy.observe(tree, path, t3 - t0)
            stats.steps += 1
            stats.drafted_tokens += tree.n_draft
            stats.record_accept(n_accepted)
            stats.record_budget(tree.n_draft)
            stats.time_drafting += t1 - t0
            stats.draft_seconds.append(t1 - t0)
            stats.time_verifying += t2 - t1
            stats.time_accepting += t3 - t2
            emitted = np.empty(n_accepted + 1, np.int32)
            emitted[:n_accepted] = tree.tokens[path[1:]]
            emitted[n_accepted] = next_token
    finally:
        drafter.finish()
        stats.time_total = time.perf_counter() - t_start
    tokens = context[n_prompt:n_context].copy()
    text = verifier.decode(tokens) if was_text and hasattr(verifier, "decode") else None
    return SpeculateResult(tokens=tokens, stop_reason=stop_reason, stats=stats, text=text, seed=rule.seed)


def _apply_stops(emitted, context, n_context, n_prompt, max_new_tokens, eos_ids, stops):
    """Cut `emitted` at the first EOS / completed stop sequence / token budget; say why it stopped."""
    n_generated = n_context - n_prompt
    for i in range(emitted.shape[0]):
        token = emitted[i]
        if eos_ids.shape[0] and (eos_ids == token).any():
            return emitted[:i + 1], "eos"
        for stop in stops:
            n = stop.shape[0]
            end = n_context + i + 1  # candidate tail: context[..n_context] + emitted[..i]
            if end - n >= n_prompt and stop[-1] == token:
                tail = np.concatenate([context[end - n:n_context], emitted[:i + 1]])[-n:]
                if np.array_equal(tail, stop):
                    return emitted[:i + 1], "stop_sequence"
        if n_generated + i + 1 >= max_new_tokens:
            return emitted[:i + 1], "max_new_tokens"
    return emitted, None


def _check_tree(tree, root, request, vocab_size) -> None:
    """Full check of a tree from a drafter that is not draftcore's own."""
    if not isinstance(tree, DraftTree):
        raise BackendError(f"drafter.propose: expected a DraftTree, got {describe(tree)}")
    try:
        tree.check(vocab_size)
    except InputError as exc:
        raise BackendError(f"drafter.propose: returned a malformed tree: {exc}") from None
    if tree.tokens[0] != root:
        raise BackendError(f"drafter.propose: tree root {int(tree.tokens[0])} is not the last context token {int(root)}")
    if tree.n_draft > request:
        raise BackendError(f"drafter.propose: returned {tree.n_draft} drafted nodes, more than the budget {request}")
