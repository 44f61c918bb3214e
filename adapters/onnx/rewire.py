"""`tree_from_genai(genai_dir, out_dir)`: tree mode for a model built by onnxruntime-genai's model
builder, keeping its fused kernels.

A genai-built decoder runs every layer's attention as one GroupQueryAttention node (rotary, KV
append and causal attention fused) and takes a 2-D attention_mask, from which a small subgraph
derives each node's sequence lengths. Causal only: as it is, it verifies one branch (chain mode).
GroupQueryAttention also has two optional inputs the builder leaves empty: `position_ids` (the
rotary positions of the new tokens) and `attention_bias` (added to Q·Kᵀ, [1, 1, q, past + q]).
Wiring draftcore's tree inputs into them gives the tree interface of graph.py:

    attention_mask  float[1, 1, q, past + q]  additive tree mask  -> every node's attention_bias
                                              (its last dimension's length also makes the all-ones
                                              2-D mask the builder's subgraph reads)
    position_ids    int64[1, q]               n_past + depth      -> every node's position_ids
    argmax          int32[1, q]               ArgMax of logits, added at the end

The attention itself still masks causally by index; a tree's nodes come parents first, so that
mask lets through every ancestor and the additive mask removes the rest. Weights, kernels and
everything else stay as the builder made them. The result is checked before it is kept: a
branching tree against the same graph's one-token decoding (OrtVerifier's self-check) and
one-token decoding against the original genai model's.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from draftcore.errors import BackendError, ConfigError

from .graph import FORMAT_KEY, FORMAT_VALUE

_GQA = "GroupQueryAttention"
_POSITION_IDS_SLOT, _BIAS_SLOT = 9, 10     # GroupQueryAttention's optional inputs (com.microsoft, v1)
_MASK = "attention_mask"
_ONES = "draftcore/ones_mask"


def tree_from_genai(genai_dir, out_dir, *, self_check: bool = True) -> Path:
    """Write `out_dir/model.onnx` (graph.py's tree interface) from an onnxruntime-genai model folder
    (genai_config.json and its decoder); return its path. ConfigError for a folder or graph this
    rewiring does not fit; BackendError (nothing kept) when the result fails its check."""
    import onnx

    source = Path(genai_dir)
    config = _genai_config(source)
    decoder = config.get("decoder", {})
    model = onnx.load(str(source / decoder.get("filename", "model.onnx")))
    _rewire(model, head_size=_positive(decoder, "head_size"), context=_positive(config, "context_length"))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "model.onnx"
    files = (path, out / "model.onnx.data")
    for stale in files:   # onnx.save appends to an existing data file
        stale.unlink(missing_ok=True)
    onnx.save(model, str(path), save_as_external_data=True, location=files[1].name)
    if self_check:
        try:
            _check(path, source)
        except BaseException:
            for written in files:
                written.unlink(missing_ok=True)
            raise
    return path


def _rewire(model, head_size: int, context: int) -> None:
    from onnx import TensorProto, helper

    graph = model.graph
    inputs = {i.name: i for i in graph.input}
    if _MASK not in inputs or len(inputs[_MASK].type.tensor_type.shape.dim) != 2:
        raise ConfigError(f"genai_dir: the decoder has no 2-D {_MASK} input (inputs: {sorted(inputs)}); "
                          f"expected a model built by onnxruntime-genai's model builder")
    if "position_ids" in inputs:
        raise ConfigError("genai_dir: the decoder already takes position_ids; only graphs whose positions come "
                          "from the 2-D mask (onnxruntime-genai's builder) are rewired")
    attention = [node for node in graph.node if node.op_type == _GQA and node.domain == "com.microsoft"]
    if not attention:
        raise ConfigError(f"genai_dir: the decoder has no {_GQA} node; tree mode is wired into its optional "
                          f"position_ids and attention_bias inputs")
    for node in attention:
        used = [node.input[slot] for slot in (_POSITION_IDS_SLOT, _BIAS_SLOT) if slot < len(node.input)]
        if any(used):
            raise ConfigError(f"genai_dir: {_GQA} node {node.name!r} already uses position_ids/attention_bias "
                              f"({used})")
    kv_type = inputs["past_key_values.0.key"].type.tensor_type.elem_type

    for node in graph.node:   # the builder's mask subgraph now reads an all-ones mask of length past + q
        for slot, name in enumerate(node.input):
            if name == _MASK:
                node.input[slot] = _ONES
    inputs[_MASK].CopyFrom(helper.make_tensor_value_info(_MASK, kv_type, [1, 1, "sequence_length",
                                                                          "total_sequence_length"]))
    graph.input.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "sequence_length"]))
    for node in attention:
        while len(node.input) <= _BIAS_SLOT:
            node.input.append("")
        node.input[_POSITION_IDS_SLOT] = "position_ids"
        node.input[_BIAS_SLOT] = _MASK
    for value in [*graph.input, *graph.output]:   # the builder leaves the head size symbolic
        dims = value.type.tensor_type.shape.dim
        if value.name.startswith(("past_key_values.", "present.")) and len(dims) == 4 and dims[3].dim_param:
            dims[3].dim_value = head_size

    ones = [
        helper.make_node("Shape", [_MASK], ["draftcore/total_length"], start=3, end=4),
        helper.make_node("Constant", [], ["draftcore/one"], value=helper.make_tensor("one", TensorProto.INT64, [1], [1])),
        helper.make_node("Concat", ["draftcore/one", "draftcore/total_length"], ["draftcore/ones_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["draftcore/ones_shape"], [_ONES],
                         value=helper.make_tensor("value", TensorProto.INT64, [1], [1])),
    ]
    argmax = [
        helper.make_node("ArgMax", ["logits"], ["draftcore/argmax_int64"], axis=-1, keepdims=0),
        helper.make_node("Cast", ["draftcore/argmax_int64"], ["argmax"], to=TensorProto.INT32),
    ]
    nodes = [*ones, *graph.node, *argmax]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.output.append(helper.make_tensor_value_info("argmax", TensorProto.INT32, [1, "sequence_length"]))
    helper.set_model_props(model, {FORMAT_KEY: FORMAT_VALUE, "draftcore.max_context": str(context),
                                   "draftcore.source": "onnxruntime-genai model builder, rewired for trees"})


def _check(path: Path, source: Path) -> None:
    """The rewired graph's tree logits against its own one-token decoding (OrtVerifier's self-check),
    and its one-token decoding against the original model's (chain mode), on random tokens."""
    from draftcore.selfcheck import plain_decoding_logits, relative_error

    from .verifier import _TOLERANCE, OrtVerifier

    cpu = ["CPUExecutionProvider"]
    rewired = OrtVerifier(path, providers=cpu)   # raises BackendError on a wrong tree mask
    original = OrtVerifier(source, providers=cpu, self_check=False)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, rewired.vocab_size, 7).astype(np.int32)
    tokens = rng.integers(0, rewired.vocab_size, 4).astype(np.int32)
    err = relative_error(plain_decoding_logits(rewired, prompt, tokens), plain_decoding_logits(original, prompt, tokens))
    if not err <= _TOLERANCE[rewired.kv_dtype]:
        raise BackendError(f"tree_from_genai: the rewired graph's one-token decoding differs from the original "
                           f"model's (relative error {err:.3g}); the rewiring does not fit this graph")


def _genai_config(source: Path) -> dict:
    file = source / "genai_config.json"
    if not file.is_file():
        raise ConfigError(f"genai_dir: {str(source)!r} has no genai_config.json; expected a folder made by "
                          f"onnxruntime-genai's model builder")
    return json.loads(file.read_text()).get("model", {})


def _positive(section: dict, key: str) -> int:
    value = section.get(key, section.get("decoder", {}).get(key))
    if not isinstance(value, int) or value <= 0:
        raise ConfigError(f"genai_dir: genai_config.json has {key}={value!r}, expected a positive integer")
    return value

