"""The verifier's KV cache: appended in place, rolled back to the committed context plus an accepted path.

transformers 5.x keeps one layer object per decoder layer in `cache.layers`; each holds `.keys` and
`.values` shaped [batch, kv_heads, seq, head_dim]. Its `DynamicLayer` grows them with torch.cat on
every forward, which copies the whole context of every layer at every step: at 3,000 tokens of
context a SmolLM2 verify of 1 / 4 nodes took 119 / 168 ms with it and 94 / 126 ms without (2-core
CPU, benchmarks/hf_verify_cost.py). `GrowingLayer` (below) writes new positions
into a buffer with room to spare and hands attention a view of the filled part, so a step copies only
its own new positions. The values attention reads are the same, so are the logits (tested bit for bit
against `DynamicCache`). The cache is a transformers `Cache` of these layers (its documented
`layer_class_to_replicate`); nothing of transformers is modified.

`DynamicLayer.crop(n)` only accepts n <= 0 (tokens to drop from the end), and nothing gathers along
the sequence, so both operations are done here directly on `.keys` / `.values` (views of the buffer).
Every layer is a full-attention layer (no sliding-window layer, whose `cumulative_length`
bookkeeping a gather would break).

transformers 5.24 renamed the forward's cache argument, and the output's field, from
`past_key_values` to `cache`; the old names still work there, with a FutureWarning, until 5.40.
`cache_keyword` and `returned_cache` use whichever name the model's own forward declares, so the
adapters neither warn on 5.24+ nor break on older releases. The ONNX export keeps its own copy of the
two (adapters/onnx/transformers_cache.py: no adapter imports another); a change here goes there too.
"""
from __future__ import annotations

import inspect
from functools import partial

import torch
from transformers.cache_utils import Cache, DynamicLayer

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


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` that appends into a buffer instead of concatenating.

    `.keys` / `.values` are views [..., :length, :] of buffers holding up to `capacity` positions.
    When an append does not fit, the buffers are replaced by larger ones (the filled part copied once),
    growing by half the length (at least GROWTH_MIN positions) but never past `max_length`, the
    verifier's max_context: memory stays bounded. Whatever replaced `.keys` from outside (a crop, a
    reset, a batch operation of transformers) is detected by its storage and copied into new buffers.
    """

    _layer_type = None   # never registered in transformers' layer-type mappings
    GROWTH_MIN = 256

    def __init__(self, max_length: int, **kwargs):
        super().__init__(**kwargs)
        self.max_length = max_length
        self._key_buffer = self._value_buffer = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        if not self._appends_in_place(end):
            self._grow(key_states, value_states, length, end)
        self._key_buffer[..., length:end, :] = key_states
        self._value_buffer[..., length:end, :] = value_states
        self.keys = self._key_buffer[..., :end, :]
        self.values = self._value_buffer[..., :end, :]
        return self.keys, self.values

    def _appends_in_place(self, end: int) -> bool:
        buffer = self._key_buffer
        return (buffer is not None and end <= buffer.shape[-2] and self.keys.numel() > 0
                and self.keys.data_ptr() == buffer.data_ptr() and self.values.data_ptr() == self._value_buffer.data_ptr())

    def _grow(self, key_states, value_states, length: int, end: int) -> None:
        capacity = max(end, min(self.max_length, end + max(self.GROWTH_MIN, end // 2)))
        shape = (*key_states.shape[:-2], capacity, key_states.shape[-1])
        keys, values = key_states.new_empty(shape), value_states.new_empty(shape)
        if length:
            keys[..., :length, :] = self.keys
            values[..., :length, :] = self.values
        self._key_buffer, self._value_buffer = keys, values

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = None
        super().reset()


def new_cache(max_length: int) -> Cache:
    """An empty cache of `GrowingLayer`s (created lazily by the first forward), none holding more
    than `max_length` positions."""
    return Cache(layer_class_to_replicate=partial(GrowingLayer, max_length))


def cache_length(cache: Cache) -> int:
    """Tokens held by the cache (the first initialized layer's sequence length; 0 when empty)."""
    for layer in cache.layers:
        if layer.is_initialized and layer.keys is not None:
            return int(layer.keys.shape[-2])
    return 0


def truncate(cache: Cache, length: int) -> None:
    """Keep the first `length` positions of every layer (a view: no copy)."""
    for layer in cache.layers:
        if layer.is_initialized and layer.keys is not None:
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


def keep_path(cache: Cache, start: int, path: torch.Tensor) -> None:
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
