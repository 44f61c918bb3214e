"""Rolling a transformers `DynamicCache` back to the committed context plus an accepted path.

transformers 5.x keeps one layer object per decoder layer in `cache.layers`; each holds `.keys` and
`.values` shaped [batch, kv_heads, seq, head_dim] and grows them with torch.cat on every forward.
`DynamicLayer.crop(n)` only accepts n <= 0 (tokens to drop from the end), and nothing gathers along
the sequence, so both operations are done here directly on `.keys` / `.values`. The cache is built
without a config, so every layer is a plain `DynamicLayer` (no sliding-window layer, whose
`cumulative_length` bookkeeping a gather would break).

transformers 5.24 renamed the forward's cache argument, and the output's field, from
`past_key_values` to `cache`; the old names still work there, with a FutureWarning, until 5.40.
`cache_keyword` and `returned_cache` use whichever name the model's own forward declares, so the
adapters neither warn on 5.24+ nor break on older releases. The ONNX export keeps its own copy of the
two (adapters/onnx/transformers_cache.py: no adapter imports another); a change here goes there too.
"""
from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

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


def new_cache() -> DynamicCache:
    """An empty cache whose layers are all `DynamicLayer` (created lazily by the first forward)."""
    return DynamicCache()


def cache_length(cache: DynamicCache) -> int:
    """Tokens held by the cache (the first initialized layer's sequence length; 0 when empty)."""
    for layer in cache.layers:
        if layer.is_initialized and layer.keys is not None:
            return int(layer.keys.shape[-2])
    return 0


def truncate(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions of every layer (a view: no copy)."""
    for layer in cache.layers:
        if layer.is_initialized and layer.keys is not None:
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


def keep_path(cache: DynamicCache, start: int, path: torch.Tensor) -> None:
    """Keep positions [0, start) plus `start + path`, in that order; drop everything after.

    path: int64[k] on the cache's device, tree node indices relative to `start` (the tree's first
    position). Only the tail moves: the gathered rows are written over positions
    [start, start + k) (index_select copies first, so source and destination may overlap) and the
    layer is cut to start + k. The committed context is never copied.
    """
    k = int(path.shape[0])
    rows = path + start
    for layer in cache.layers:
        if layer.is_initialized and layer.keys is not None:
            for name in ("keys", "values"):
                t = getattr(layer, name)
                t[..., start:start + k, :] = t.index_select(-2, rows)
                setattr(layer, name, t[..., :start + k, :])
