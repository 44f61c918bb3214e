"""The decoder's Linear layers of a small CPU verify as `W @ x.T`, inside a scoped torch function mode.

Every Linear of a causal LM computes `F.linear(x, W) = x @ W.T`. On CPU torch hands that to MKL
as a GEMM with W as the transposed right operand, which packs (copies) W on each call, or, for one
row, as a GEMV that streams W at ~10 GB/s on this project's 2-core AMD EPYC. Written as `W @ x.T`
(W the left operand, read in place) the same products of 2-4 rows run 2.5-3.5x faster. For all 210
Linear layers of SmolLM2-135M (fp32, weights cold in cache as in decoding; median ms):

    rows                      1     2     3     4     6     8    16
    F.linear(x, W)         39.2  55.3  63.6  49.4  41.5  45.1  55.7
    W @ x.T                40.6  15.4  24.4  22.4  36.0  38.4  48.0

so a one-row product is best computed as two identical rows. The whole decoder forward gains less
(1 → 2 tokens: 50 → 41 and 74 → 55 ms), because every torch call inside the mode pays ~3 us of
Python dispatch (~2,000 calls per SmolLM2 forward), which is why the mode is entered only for the
tree sizes where it measured fastest at construction (head.py, `_linear_plan`).

`WeightMajorLinear` is a `torch.overrides.TorchFunctionMode`: the documented way to override torch
functions inside a `with` block, on the calling thread only. The model, its modules and torch itself
are not modified; other `F.linear` calls (GPU tensors, other dtypes, tensor-subclass weights such as
quantized ones) pass through unchanged. Whether the model's logits survive is not assumed: the split
head's construction check (head.py) runs the mode on a tree-masked batch against the model's forward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_PLAIN_WEIGHTS = (torch.Tensor, torch.nn.Parameter)


class WeightMajorLinear(TorchFunctionMode):
    """Inside `with WeightMajorLinear():`, CPU `F.linear(x, W, b)` is computed as `(W @ x.T).T + b`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            out = _weight_major_linear(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _weight_major_linear(input, weight, bias=None):
    """`F.linear` as `weight @ input.T`, or None where it does not apply (left to torch)."""
    if (type(weight) not in _PLAIN_WEIGHTS or weight.dim() != 2 or input.device.type != "cpu"
            or input.dtype != weight.dtype or input.dim() < 1):
        return None
    rows = input.numel() // input.shape[-1] if input.shape[-1] else 0
    if rows == 0:
        return None
    out = weight_major_product(input.reshape(rows, input.shape[-1]), weight, bias, pad_single_row=True)
    # contiguous: callers .view() the result, and the transposed product's strides would not allow it
    return out.contiguous().reshape(*input.shape[:-1], weight.shape[0])


def weight_major_product(x: torch.Tensor, weight: torch.Tensor, bias=None, pad_single_row: bool = True):
    """`x @ weight.T + bias` for 2-D x [rows, in], computed as `(weight @ x.T).T`: a [rows, out]
    view with transposed strides. pad_single_row: one row is computed as two identical rows (a
    2-row GEMM beats the GEMV here; module docstring)."""
    rows = x.shape[0]
    if rows == 1 and pad_single_row:
        x = x.repeat(2, 1)  # a real copy: an expand()ed row is slower than either
    out = torch.matmul(weight, x.T).T[:rows]
    return out if bias is None else out + bias
