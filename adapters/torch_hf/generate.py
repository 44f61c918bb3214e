"""draftcore inside transformers' own `generate()`: a two-word change to existing code.

    from draftcore.adapters.torch_hf import speculative_generate
    out = model.generate(input_ids, custom_generate=speculative_generate, max_new_tokens=128)

transformers 5.x runs its usual preparation (GenerationConfig merging, logits processors, stopping
criteria, EOS ids) and then calls `custom_generate` instead of its decoding loop. This one decodes
speculatively with draftcore and gives what `generate()` gives: the same tokens when greedy, the same
distribution when sampling (generate_options.py says which options map to what, and refuses the
rest by name); a tensor `[1, prompt + new]`, or a `GenerateDecoderOnlyOutput` with
`return_dict_in_generate=True`. A `streamer` receives the tokens as each step accepts them.

Between calls the model's verifiers and their drafter are kept (verifier_pool.py), so drafting
learns from everything the model generated. Options of our own, passed to `generate()` itself:

    drafter=...                  a name from draftcore.DRAFTER_NAMES or a Drafter (default: the
                                 pool's shared TrieDrafter)
    budget=...                   drafted candidates per step: "auto" (default), an int, a policy
    pure_logits_processors=True  the call's own `logits_processor`s are pure functions of
                                 (input_ids, scores): apply them at every drafted node
"""
from __future__ import annotations

import sys

import numpy as np
import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

import draftcore
from draftcore import ConfigError

from .generate_options import translate
from .verifier_pool import pool_of


def speculative_generate(model, input_ids, logits_processor=None, stopping_criteria=None, generation_config=None,
                         synced_gpus=False, streamer=None, *, drafter=None, budget=None,
                         pure_logits_processors: bool = False, **model_kwargs):
    """The decoding loop `model.generate(..., custom_generate=speculative_generate)` runs; its
    signature is `GenerationMixin._sample`'s plus draftcore's options (module docstring)."""
    if streamer is None:
        streamer = _argument_of_generate("streamer")
    try:
        if synced_gpus:
            raise ConfigError("synced_gpus=True: speculative_generate runs on one process's model; leave it unset")
        if _argument_of_generate("assistant_model") is not None:
            raise ConfigError("assistant_model: speculative_generate drafts with draftcore, not with a draft model; "
                              "leave assistant_model unset")
        if not isinstance(pure_logits_processors, bool):
            raise ConfigError(f"pure_logits_processors: expected True or False, got {pure_logits_processors!r}")
        options = translate(input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs,
                            pure_logits_processors)
        prompt = input_ids[0].detach().cpu().numpy().astype(np.int32)
        new_tokens = _decode(model, prompt, options, drafter, budget, streamer) if options.max_new_tokens > 0 \
            else np.empty(0, np.int32)
    finally:
        if streamer is not None:
            streamer.end()   # also on an error: a TextIteratorStreamer's reader must not wait forever
    sequences = torch.cat([input_ids, torch.from_numpy(new_tokens.astype(np.int64))[None, :].to(input_ids.device)],
                          dim=1)
    if generation_config is not None and generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences


def _decode(model, prompt: np.ndarray, options, drafter, budget, streamer) -> np.ndarray:
    pool = pool_of(model)
    with pool.verifier(prompt) as verifier:
        if drafter is None:
            drafter = pool.drafter
        stream = draftcore.speculate_stream(verifier, prompt, max_new_tokens=options.max_new_tokens,
                                            drafter=drafter, budget=budget, eos_token_id=options.eos_token_id,
                                            sampling=options.sampling)
        sequence = np.empty(prompt.shape[0] + options.max_new_tokens, np.int64)
        sequence[:prompt.shape[0]] = prompt
        n = prompt.shape[0]
        with stream:   # closing ends the request when a check stops generation early
            for tokens in stream:
                keep, stop = _until_check_stops(options.checks, sequence, n, tokens)
                sequence[n:n + keep] = tokens[:keep]
                n += keep
                if streamer is not None and keep:
                    streamer.put(torch.from_numpy(tokens[:keep].astype(np.int64)))
                if stop:
                    break
    return sequence[prompt.shape[0]:n].astype(np.int32)


def _until_check_stops(checks, sequence: np.ndarray, n: int, tokens: np.ndarray) -> tuple[int, bool]:
    """(how many of `tokens` to keep, whether a stopping criterion fired): the criteria transformers
    evaluates after every token (stop strings, max_time, the user's) are evaluated after every token
    here too, on the sequence so far. They get no scores (None): a verified step has no per-token row."""
    if not checks:
        return tokens.shape[0], False
    for i in range(tokens.shape[0]):
        sequence[n + i] = tokens[i]
        ids = torch.from_numpy(sequence[:n + i + 1])[None, :]
        if any(bool(torch.as_tensor(check(ids, None)).any()) for check in checks):
            return i + 1, True
    return tokens.shape[0], False


def _argument_of_generate(name: str):
    """`generate()`'s own argument `name`, read from its frame when it called us.

    transformers 5.x (checked up to 5.23) calls a callable `custom_generate` without the `streamer`
    and `assistant_model` it was given (`_extract_generation_mode_kwargs` keeps only the callable's
    extra parameters); the streamer has already received the prompt, so dropping it would leave a
    TextIteratorStreamer's reader waiting forever. Nothing is patched: the caller's argument is read."""
    frame = sys._getframe(2)   # 0: this function, 1: speculative_generate, 2: its caller
    code = frame.f_code
    if code.co_name == "generate" and frame.f_globals.get("__name__") == "transformers.generation.utils":
        return frame.f_locals.get(name)
    return None
