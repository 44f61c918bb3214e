"""What an ONNX decoder graph takes and gives, read from the session: which of the three supported
interfaces it has, and the names of its KV inputs and outputs.

    tree   draftcore's own export (export.py): attention_mask float[1, 1, q, past + q] (additive),
           position_ids, outputs logits, argmax (int32, per node, computed in the graph), present.*
    chain  a standard decoder export with a 2-D attention_mask int64[1, past + q] (optimum-onnx; the
           model.onnx in a folder built by onnxruntime-genai's model builder): causal only, so one
           branch per verify; position_ids optional (genai models without it derive positions from
           the mask, which is all ones here)

KV names follow the convention both tools use: inputs past_key_values.{i}.key / .value, outputs
present.{i}.key / .value, shaped [batch, kv_heads, length, head_dim].
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from draftcore.errors import ConfigError

TREE, CHAIN = "tree", "chain"
FORMAT_KEY = "draftcore.format"       # metadata written by export.py
FORMAT_VALUE = "tree-v1"

_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
              "tensor(int32)": np.int32, "tensor(bfloat16)": None}


@dataclass(frozen=True)
class GraphInterface:
    mode: str                     # TREE or CHAIN
    n_layers: int
    kv_heads: int
    head_dim: int | None          # None where the graph leaves it symbolic (genai: 'kv_cache_dim')
    vocab_size: int | None        # from the logits output's static shape, if it has one
    kv_dtype: type                # numpy dtype of the past/present tensors
    mask_dtype: type              # numpy dtype of attention_mask
    has_position_ids: bool
    past_names: tuple             # (key_0, value_0, key_1, ...)
    present_names: tuple
    has_argmax: bool


def read_interface(session) -> GraphInterface:
    """The interface of `session`'s graph, or ConfigError listing the inputs found."""
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    found = ", ".join(f"{name}{list(i.shape)}:{i.type}" for name, i in inputs.items())

    def refuse(why: str):
        raise ConfigError(f"session: {why}; the graph's inputs are: {found}. Expected a decoder with "
                          f"input_ids, attention_mask (4-D additive: draftcore.adapters.onnx.export; 2-D: "
                          f"optimum-onnx or onnxruntime-genai), past_key_values.{{i}}.key/.value and outputs "
                          f"logits, present.{{i}}.key/.value")

    if "input_ids" not in inputs or "attention_mask" not in inputs or "logits" not in outputs:
        refuse("no input_ids, attention_mask or logits")
    layers = {}
    for name in inputs:
        match = _PAST.match(name)
        if match:
            layers.setdefault(int(match.group(1)), set()).add(match.group(2))
    if not layers or sorted(layers) != list(range(len(layers))) or any(v != {"key", "value"} for v in layers.values()):
        refuse("no complete past_key_values.{i}.key/.value inputs for layers 0 .. n-1")
    n_layers = len(layers)
    past = tuple(f"past_key_values.{i}.{kind}" for i in range(n_layers) for kind in ("key", "value"))
    present = tuple(f"present.{i}.{kind}" for i in range(n_layers) for kind in ("key", "value"))
    missing = [name for name in present if name not in outputs]
    if missing:
        refuse(f"outputs {missing[:2]}... are missing (found outputs {list(outputs)})")
    extra = set(inputs) - set(past) - {"input_ids", "attention_mask", "position_ids"}
    if extra:
        refuse(f"inputs {sorted(extra)} are not supported")

    mask = inputs["attention_mask"]
    if len(mask.shape) == 4:
        mode = TREE
    elif len(mask.shape) == 2:
        mode = CHAIN
    else:
        refuse(f"attention_mask has rank {len(mask.shape)}, expected 4 (tree) or 2 (chain)")
    if mode == TREE and "position_ids" not in inputs:
        refuse("a 4-D attention_mask without position_ids")
    key = inputs[past[0]]
    if len(key.shape) != 4 or not isinstance(key.shape[1], int):
        refuse(f"{past[0]} has shape {key.shape}, expected [batch, kv_heads, past, head_dim] with static kv_heads")
    kv_dtype = _ORT_TYPES.get(key.type)
    mask_dtype = _ORT_TYPES.get(mask.type)
    if kv_dtype is None or mask_dtype is None:
        refuse(f"{past[0]} is {key.type} and attention_mask {mask.type}: supported are float, float16, int64")
    logits_shape = outputs["logits"].shape
    vocab = logits_shape[-1] if logits_shape and isinstance(logits_shape[-1], int) else None
    head_dim = key.shape[3] if isinstance(key.shape[3], int) else None
    return GraphInterface(mode=mode, n_layers=n_layers, kv_heads=int(key.shape[1]), head_dim=head_dim,
                          vocab_size=vocab, kv_dtype=kv_dtype, mask_dtype=mask_dtype,
                          has_position_ids="position_ids" in inputs, past_names=past, present_names=present,
                          has_argmax="argmax" in outputs)
