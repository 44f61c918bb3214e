"""The HF verifier's KV cache (adapters/torch_hf/kv_cache.py): appending in place gives the same
logits, bit for bit, as transformers' own concatenating DynamicCache, through decoding, tree forwards,
rollbacks and the buffers' growth, and never holds more than its max_length."""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from draftcore import DraftTree  # noqa: E402
from draftcore.adapters.torch_hf import kv_cache  # noqa: E402
from draftcore.adapters.torch_hf.masks import tree_forward_inputs  # noqa: E402
from fixtures.tiny_llama import tiny_llama  # noqa: E402
from transformers import DynamicCache  # noqa: E402

MAX_LENGTH = 512


def _forward(model, cache, **inputs):
    keyword = kv_cache.cache_keyword(model)
    with torch.inference_mode():
        return model(use_cache=True, **{keyword: cache}, **inputs).logits[0]


def _decode(model, cache, token, n_past):
    return _forward(model, cache, input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[n_past]]))


@pytest.mark.parametrize("attn", ["sdpa", "eager", "draftcore_sdpa"])
def test_in_place_cache_gives_dynamic_cache_logits_bit_for_bit(attn):
    """Prefill, tree forwards rolled back by a slice and by a gather, and one-token steps past the
    first buffer's capacity: every logit equals DynamicCache's, and so does every cached key."""
    model = tiny_llama(seed=3, kv_heads=2, heads=4)
    model.config._attn_implementation = attn
    rng = np.random.default_rng(0)
    ours, theirs = kv_cache.new_cache(MAX_LENGTH), DynamicCache()
    prompt = torch.from_numpy(rng.integers(0, 256, 40))[None]
    n_past = 40
    assert torch.equal(_forward(model, ours, input_ids=prompt), _forward(model, theirs, input_ids=prompt))
    first_buffer = ours.layers[0]._key_buffer.data_ptr()
    token = 7
    for step in range(180):
        if step % 3 == 0:     # a tree of 6, then keep a path: a prefix (slice) or a branch (gather)
            parents = np.array([-1, 0, 0, 1, 2, 4])
            tree = DraftTree.build(np.r_[token, rng.integers(0, 256, 5)], parents)
            inputs = tree_forward_inputs(tree, n_past, torch.float32, torch.device("cpu"))
            assert torch.equal(_forward(model, ours, **inputs), _forward(model, theirs, **inputs))
            path = [0, 1] if step % 2 else [0, 2, 4, 5]
            for cache in (ours, theirs):
                with torch.inference_mode():   # as the verifier's commit runs them
                    _roll_back(cache, n_past, path)
            n_past += len(path)
            token = int(tree.tokens[path[-1]])
        else:
            logits = _decode(model, ours, token, n_past)
            assert torch.equal(logits, _decode(model, theirs, token, n_past))
            n_past += 1
            token = int(logits[-1].argmax())
        assert kv_cache.cache_length(ours) == kv_cache.cache_length(theirs) == n_past
    assert ours.layers[0]._key_buffer.data_ptr() != first_buffer   # the buffers grew on the way
    for mine, reference in zip(ours.layers, theirs.layers):
        assert torch.equal(mine.keys, reference.keys) and torch.equal(mine.values, reference.values)


def _roll_back(cache, n_past, path):
    if path == list(range(len(path))):
        kv_cache.truncate(cache, n_past + len(path))
    else:
        kv_cache.keep_path(cache, n_past, torch.tensor(path))


def test_appends_land_in_one_buffer_until_it_is_full_and_growth_stops_at_max_length():
    layer = kv_cache.GrowingLayer(max_length=300)
    chunk = torch.randn(1, 2, 1, 8)
    layer.update(torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8))
    first = layer._key_buffer
    assert first.shape[-2] == 10 + kv_cache.GrowingLayer.GROWTH_MIN   # room for 256 more
    for _ in range(256):
        keys, _ = layer.update(chunk, chunk)
        assert keys.data_ptr() == first.data_ptr()                     # no copy of the context
    keys, values = layer.update(chunk, chunk)                          # the 267th position: grow
    assert layer._key_buffer.data_ptr() != first.data_ptr()
    assert layer._key_buffer.shape[-2] == 300                          # capped at max_length
    assert keys.shape[-2] == values.shape[-2] == 267
    assert torch.equal(keys[..., :10, :], first[..., :10, :])


def test_a_tensor_put_in_from_outside_is_copied_not_overwritten():
    """transformers' own crop replaces .keys by a view; a reset drops them: the next append still
    sees exactly the positions the layer holds."""
    layer = kv_cache.GrowingLayer(max_length=100)
    data = torch.arange(2 * 20, dtype=torch.float32).reshape(1, 1, 20, 2)
    layer.update(data[..., :10, :], data[..., :10, :])
    layer.crop(-4)                                  # keeps 6, a view of the same buffer
    keys, _ = layer.update(data[..., 10:12, :], data[..., 10:12, :])
    assert torch.equal(keys, torch.cat([data[..., :6, :], data[..., 10:12, :]], -2))
    outside = torch.ones(1, 1, 3, 2)
    layer.keys, layer.values = outside, outside.clone()   # not a view of the buffer
    keys, _ = layer.update(data[..., :1, :], data[..., :1, :])
    assert torch.equal(keys, torch.cat([outside, data[..., :1, :]], -2))
    assert torch.equal(outside, torch.ones(1, 1, 3, 2))   # the outside tensor was not written into
    layer.reset()
    keys, _ = layer.update(data[..., :2, :], data[..., :2, :])
    assert torch.equal(keys, data[..., :2, :])
