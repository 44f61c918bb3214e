"""The KV cache of an ONNX decoder, kept as OrtValues where the session runs (a CUDA EP keeps it on
the device between steps), and the commit that keeps some of its rows.

A verify binds the cache as the past inputs and gets the presents (past + tree rows) back as new
OrtValues. A commit keeps the context and the accepted path: rows 0 .. n_past - 1 and n_past + path.
It runs as a Gather on axis 2 of every present, in a one-node ONNX graph on the decoder's own
providers, so the rows never leave the device; on the CPU EP it is the same graph (one code path,
tested here).
"""
from __future__ import annotations

import numpy as np


def empty_cache(ort, n_layers: int, kv_heads: int, head_dim: int, dtype, device: str, device_id: int) -> list:
    """2 * n_layers OrtValues of shape [1, kv_heads, 0, head_dim] (no context yet)."""
    zero = np.zeros((1, kv_heads, 0, head_dim), dtype)
    return [ort.OrtValue.ortvalue_from_numpy(zero, device, device_id) for _ in range(2 * n_layers)]


class RowGather:
    """keep(values, rows) -> the values with only `rows` (int64, in order) of axis 2 kept."""

    def __init__(self, ort, n_tensors: int, dtype, providers, device: str, device_id: int):
        from onnx import TensorProto, helper

        elem = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}[np.dtype(dtype).type]
        inputs = [helper.make_tensor_value_info(f"x{i}", elem, [1, "h", "t", "d"]) for i in range(n_tensors)]
        inputs.append(helper.make_tensor_value_info("rows", TensorProto.INT64, ["k"]))
        outputs = [helper.make_tensor_value_info(f"y{i}", elem, [1, "h", "k", "d"]) for i in range(n_tensors)]
        nodes = [helper.make_node("Gather", [f"x{i}", "rows"], [f"y{i}"], axis=2) for i in range(n_tensors)]
        graph = helper.make_graph(nodes, "draftcore_keep_rows", inputs, outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self._session = ort.InferenceSession(model.SerializeToString(), options, providers=providers)
        self._ort, self._n = ort, n_tensors
        self._device, self._device_id = device, device_id
        self._outputs = [f"y{i}" for i in range(n_tensors)]

    def keep(self, values: list, rows: np.ndarray) -> list:
        binding = self._session.io_binding()
        for i, value in enumerate(values):
            binding.bind_ortvalue_input(f"x{i}", value)
        binding.bind_cpu_input("rows", np.ascontiguousarray(rows, np.int64))
        for name in self._outputs:
            binding.bind_output(name, self._device, self._device_id)
        self._session.run_with_iobinding(binding)
        return binding.get_outputs()
