"""A backend for the tooling's tests: the toy model behind the bench hooks, no framework.

Registered in tests with `draftcore.tools.backends.register_backend("toy", "fake_backend")`.
"""
from __future__ import annotations

import numpy as np
from fixtures.toy import ToyModel, ToyVerifier

from draftcore.tools.bench import Prompt, draftcore_method

VOCAB = 24


def load_model(model_path=None, dtype=None, device=None):
    return ToyModel(vocab_size=VOCAB, seed=0), None


def load_prompts(tokenizer, dataset: str, n: int) -> list[Prompt]:
    rng = np.random.default_rng(len(dataset))
    return [Prompt(dataset, i, rng.integers(0, VOCAB, 6).astype(np.int32)) for i in range(n)]


def make_methods(model, tokenizer, names):
    verifier = ToyVerifier(model)
    return [draftcore_method(name, verifier, lambda: 4) for name in names]


def plain_greedy(model, tokenizer, prompt_ids, max_new_tokens):
    return model.greedy(prompt_ids, max_new_tokens)


def model_settings(model):
    return {"attn": "toy-attention"}   # the optional hook: what the bench's JSON records of the model
