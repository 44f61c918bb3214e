"""Which name a transformers model takes its KV cache by, for tracing its forward (export.py).

transformers 5.24 renamed the forward's cache argument, and the output's field, from
`past_key_values` to `cache`; the old names still work there, with a FutureWarning, until 5.40.
These use whichever name the model's own forward declares, so the export neither warns on 5.24+ nor
breaks on older releases. The HF adapter holds the same two functions (torch_hf/kv_cache.py): an
adapter imports no other, so the ONNX one works, and changes, without the HF one installed.
"""
from __future__ import annotations

import inspect

_CACHE_NAMES = ("cache", "past_key_values")   # transformers >= 5.24, and before


def cache_keyword(model) -> str:
    """The name `model`'s forward takes its KV cache by: the first forward along the class hierarchy
    that declares one of the two (a subclass whose forward takes **kwargs passes them on), else
    "past_key_values" (a forward that declares neither predates the rename)."""
    for cls in type(model).__mro__:
        forward = cls.__dict__.get("forward")
        if forward is None:
            continue
        try:
            parameters = inspect.signature(forward).parameters   # follows the deprecation decorator's wraps
        except (TypeError, ValueError):
            continue
        for name in _CACHE_NAMES:
            if name in parameters:
                return name
    return "past_key_values"


def returned_cache(output):
    """The cache a forward's output carries, under either name (None if it carries none)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)
