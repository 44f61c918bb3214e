"""The KV cache of an ONNX decoder, kept as OrtValues where the session runs (a CUDA EP keeps it on
the device between steps), and the commit that keeps some of its rows.

A verify binds the cache as the past inputs and gets the presents (past + tree rows) back as new
OrtValues. A commit keeps the context and the accepted path: rows 0 .. n_past - 1 and n_past + path.
It runs as a Gather on axis 2 of every present, in a one-node ONNX graph on the decoder's own
providers, so the rows never leave the device; on the CPU EP it is the same graph (one code path,
tested here).

Graphs whose attention reads the past and writes the present in one buffer (onnxruntime-genai's
GroupQueryAttention models, which say so with `past_present_share_buffer` in genai_config.json) get a
`SharedCache` instead: one preallocated buffer per tensor, bound as both past input and present
output, so a run writes only its new rows and reads rows 0 .. total - 1, where total is the 2-D
attention mask's length. A commit of a chain prefix is then free (n_past moves; rows past it are
overwritten by the next run before anything reads them), and a step no longer copies the whole
past into a fresh present.
"""
from __future__ import annotations

import numpy as np


def _one_node_session(ort, nodes, inputs, outputs, providers):
    from onnx import helper

    graph = helper.make_graph(nodes, "draftcore_kv", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=providers)


def _elem_type(dtype):
    from onnx import TensorProto

    return {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}[np.dtype(dtype).type]


def empty_cache(ort, n_layers: int, kv_heads: int, head_dim: int, dtype, device: str, device_id: int) -> list:
    """2 * n_layers OrtValues of shape [1, kv_heads, 0, head_dim] (no context yet)."""
    zero = np.zeros((1, kv_heads, 0, head_dim), dtype)
    return [ort.OrtValue.ortvalue_from_numpy(zero, device, device_id) for _ in range(2 * n_layers)]


class RowGather:
    """keep(values, rows) -> the values with only `rows` (int64, in order) of axis 2 kept."""

    def __init__(self, ort, n_tensors: int, dtype, providers, device: str, device_id: int):
        from onnx import TensorProto, helper

        elem = _elem_type(dtype)
        inputs = [helper.make_tensor_value_info(f"x{i}", elem, [1, "h", "t", "d"]) for i in range(n_tensors)]
        inputs.append(helper.make_tensor_value_info("rows", TensorProto.INT64, ["k"]))
        outputs = [helper.make_tensor_value_info(f"y{i}", elem, [1, "h", "k", "d"]) for i in range(n_tensors)]
        nodes = [helper.make_node("Gather", [f"x{i}", "rows"], [f"y{i}"], axis=2) for i in range(n_tensors)]
        self._session = _one_node_session(ort, nodes, inputs, outputs, providers)
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


class SharedCache:
    """One buffer per KV tensor, [1, kv_heads, capacity, head_dim], bound as past and present alike.

    `reserve(length)` makes room for `length` positions, growing by doubling up to `limit` (a Pad on
    the session's providers: the rows stay where they are); the buffers are kept across sequences,
    so a server reallocates only when a longer request arrives. Capacity starts small because
    GroupQueryAttention's scratch grows with it (query rows x capacity per head).
    """

    def __init__(self, ort, n_tensors: int, kv_heads: int, head_dim: int, dtype, providers, device: str,
                 device_id: int, limit: int):
        from onnx import TensorProto, helper

        elem = _elem_type(dtype)
        inputs = [helper.make_tensor_value_info(f"x{i}", elem, [1, "h", "t", "d"]) for i in range(n_tensors)]
        inputs.append(helper.make_tensor_value_info("pads", TensorProto.INT64, [8]))
        outputs = [helper.make_tensor_value_info(f"y{i}", elem, [1, "h", "u", "d"]) for i in range(n_tensors)]
        nodes = [helper.make_node("Pad", [f"x{i}", "pads"], [f"y{i}"]) for i in range(n_tensors)]
        self._pad = _one_node_session(ort, nodes, inputs, outputs, providers)
        self._ort, self._n, self._limit = ort, n_tensors, limit
        self._shape = (1, kv_heads, 0, head_dim)
        self._dtype, self._device, self._device_id = dtype, device, device_id
        self.values: list = []
        self.capacity = 0

    def reserve(self, length: int) -> None:
        if length <= self.capacity:
            return
        capacity = min(self._limit, max(length + 64, 2 * self.capacity, 256))
        if not self.values:
            shape = (*self._shape[:2], capacity, self._shape[3])
            # one array per tensor: on the CPU EP an OrtValue wraps the array's memory, so a shared
            # array would make every layer's buffer the same memory; kept referenced for that reason
            self._host = [np.zeros(shape, self._dtype) for _ in range(self._n)]
            self.values = [self._ort.OrtValue.ortvalue_from_numpy(zero, self._device, self._device_id)
                           for zero in self._host]
        else:
            binding = self._pad.io_binding()
            for i, value in enumerate(self.values):
                binding.bind_ortvalue_input(f"x{i}", value)
            binding.bind_cpu_input("pads", np.array([0, 0, 0, 0, 0, 0, capacity - self.capacity, 0], np.int64))
            for i in range(self._n):
                binding.bind_output(f"y{i}", self._device, self._device_id)
            self._pad.run_with_iobinding(binding)
            self.values = binding.get_outputs()
        self.capacity = capacity
