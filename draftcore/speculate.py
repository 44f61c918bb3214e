"""The public calls: `speculate` and its streaming twin `speculate_stream`.

    result = draftcore.speculate(verifier, prompt_ids, max_new_tokens=128)
    for tokens in draftcore.speculate_stream(verifier, prompt_ids): ...

A drafter or budget left out (or named, or "auto") comes from the verifier's own `Session`
(`Session.of(verifier)`), which keeps what its drafter and budget learn across calls; the loop itself
is `draftcore.loop`.
"""
from __future__ import annotations

from .call import takes_options
from .loop import SpeculationStream
from .result import SpeculateResult
from .session import Session


@takes_options
def speculate(verifier, prompt, **options) -> SpeculateResult:
    """Generate up to `max_new_tokens` tokens after `prompt`, exactly as plain decoding with
    `verifier` would: token for token when greedy, with the same distribution over sequences when
    sampling.

    prompt: int32 token ids, or a string when the verifier has `encode`.
    drafter: a Drafter; a name from `draftcore.DRAFTER_NAMES` ("trie", "ngram", "jacobi",
        "composite", ...: the verifier's session keeps one drafter per name, learning across calls);
        default: the verifier's session drafter (`Session.of(verifier).drafter`, which keeps
        learning from every request to this verifier).
    budget: drafted candidates verified per step: None or "auto" (default: the verifier's session
        budget, a `CostAwareBudget` that picks the tree size with the best expected tokens per second
        from measured step costs and acceptance, and keeps learning across calls), an int (fixed), or
        a budget policy object.
    eos_token_id: an id or a collection of ids that end generation (kept in the output).
    stop_sequences: token-id sequences that end generation once generated (kept in the output).
    sampling: None (greedy, the default), a `SamplingParams`, or a dict of its fields with
        transformers' names: temperature, top_k, top_p, min_p, repetition_penalty,
        presence_penalty, frequency_penalty, do_sample, seed. `result.seed` replays the run.
    clock: () -> seconds, what step times are measured with (default time.perf_counter); a
        synthetic clock makes the auto budget's choices reproducible (tests, trace replay).

    The arguments and their defaults are defined once, in `draftcore.call.Options`; a name that is
    not one of them is refused with an InputError naming it.
    """
    with speculate_stream(verifier, prompt, **options) as stream:
        for _ in stream:
            pass
    return stream.result


@takes_options
def speculate_stream(verifier, prompt, **options) -> SpeculationStream:
    """Streaming twin of `speculate`: iterate to receive tokens as they are accepted.

    Every argument is validated here, before any verifier or drafter state changes; then the
    verifier is claimed for this request (see `SpeculationStream` for the lifetime).
    """
    return Session.open_bare(verifier, prompt, options)
