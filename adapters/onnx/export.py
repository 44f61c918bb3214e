"""`export(model_or_dir, out_dir)`: a transformers causal LM as an ONNX decoder that verifies whole
draft trees, and the check that ONNX Runtime runs it as PyTorch does.

The graph (graph.py's "tree" interface)::

    inputs   input_ids       int64[1, q]
             position_ids    int64[1, q]                 n_past + depth of each node
             attention_mask  float[1, 1, q, past + q]    additive: 0 where a node sees a position,
                                                         the dtype's min where not (never a bool mask:
                                                         transformers' eager attention adds it)
             past_key_values.{i}.key / .value   float[1, kv_heads, past, head_dim]
    outputs  logits          float[1, q, vocab]
             argmax          int32[1, q]   each node's argmax, in the graph: a greedy verify copies
                                           q ints to the host, never q x vocab floats
             present.{i}.key / .value           float[1, kv_heads, past + q, head_dim]

Query and past lengths are dynamic. The model's own forward is traced as it is (4-D mask, explicit
positions, a DynamicCache filled from the inputs): nothing is patched. The model's metadata
(draftcore.format, max_context) goes into the ONNX file, so `OrtVerifier` needs only the file.

After writing, the export is loaded in ONNX Runtime (CPU EP) and a branching tree is compared with
the PyTorch model's plain decoding (draftcore.selfcheck); a bad export is deleted and refused.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np

from draftcore.errors import BackendError, ConfigError, describe

from .graph import FORMAT_KEY, FORMAT_VALUE

_DTYPES = ("float32", "float16")


def export(model_or_dir, out_dir, *, dtype: str | None = None, opset: int = 17, self_check: bool = True,
           max_context: int | None = None) -> Path:
    """Write `out_dir/model.onnx` (tree interface) from a transformers causal LM or a local HF model
    folder; return its path.

    dtype: "float32" or "float16" (weights, KV and mask). A folder is loaded in it (default float32);
        a model object is exported in its own dtype, which must match when dtype is given (the
        caller's model is never converted).
    self_check: compare ONNX Runtime's tree logits with PyTorch's plain decoding on a branching tree
        and raise BackendError (deleting the file) if they disagree.
    max_context: recorded in the file; default the model's max_position_embeddings.
    """
    import torch

    if dtype is not None and dtype not in _DTYPES:
        raise ConfigError(f"dtype: expected None or one of {_DTYPES}, got {dtype!r}")
    model = _load(model_or_dir, dtype)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    if dtype not in _DTYPES:
        raise ConfigError(f"model_or_dir: a {dtype} model; export supports {_DTYPES}")
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n_layers = int(config.num_hidden_layers)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    limit = int(max_context or getattr(config, "max_position_embeddings", 0) or 0)
    if limit <= 0:
        raise ConfigError("max_context: the model config has no max_position_embeddings; pass max_context=")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.onnx"

    wrapper = _tree_forward(model, n_layers)
    device = next(model.parameters()).device
    torch_dtype = getattr(torch, dtype)
    past, q = 2, 3   # example lengths; both axes are exported dynamic
    example = (torch.zeros((1, q), dtype=torch.long, device=device),
               torch.arange(past, past + q, device=device)[None],
               torch.zeros((1, 1, q, past + q), dtype=torch_dtype, device=device),
               *[torch.zeros((1, kv_heads, past, head_dim), dtype=torch_dtype, device=device)
                 for _ in range(2 * n_layers)])
    past_names = [f"past_key_values.{i}.{kind}" for i in range(n_layers) for kind in ("key", "value")]
    present_names = [f"present.{i}.{kind}" for i in range(n_layers) for kind in ("key", "value")]
    dynamic = {"input_ids": {1: "q"}, "position_ids": {1: "q"}, "attention_mask": {2: "q", 3: "total"},
               "logits": {1: "q"}, "argmax": {1: "q"}}
    dynamic.update({name: {2: "past"} for name in past_names})
    dynamic.update({name: {2: "total"} for name in present_names})
    with torch.inference_mode(False), torch.no_grad(), legacy_exporter():
        torch.onnx.export(wrapper, example, str(path), input_names=["input_ids", "position_ids", "attention_mask",
                                                                     *past_names],
                          output_names=["logits", "argmax", *present_names], dynamic_axes=dynamic,
                          opset_version=opset, dynamo=False)
    _write_metadata(path, {FORMAT_KEY: FORMAT_VALUE, "draftcore.max_context": str(limit),
                           "draftcore.dtype": dtype})
    if self_check:
        try:
            check_export(path, model)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
    return path


def check_export(path, model) -> float:
    """Tree logits from ONNX Runtime (CPU EP) against plain decoding logits from PyTorch (one causal
    forward per prefix) on draftcore.selfcheck's branching tree, a commit that gathers a branch, and
    one verify after it; return the largest relative error, raise BackendError over the tolerance."""
    import torch

    from draftcore.selfcheck import relative_error
    from draftcore.tree import DraftTree

    from .verifier import OrtVerifier

    verifier = OrtVerifier(str(path), providers=["CPUExecutionProvider"], self_check=False)
    tolerance = 1e-4 if verifier.kv_dtype == np.float32 else 2e-2
    device = next(model.parameters()).device
    rng = np.random.default_rng(0)

    def torch_rows(prompt, extra):
        ids = torch.tensor([list(prompt) + extra], device=device)
        with torch.no_grad():
            return model(input_ids=ids, use_cache=False).logits[0, len(prompt):].float().cpu().numpy()

    worst = 0.0
    for _ in range(2):   # two draws: how far a wrong mask is off depends on the tokens
        prompt = rng.integers(0, verifier.vocab_size, 6).astype(np.int32)
        r, a1, a2, b1, b2, x = (int(t) for t in rng.integers(0, verifier.vocab_size, 6))
        verifier.prefill(prompt)
        tokens, logits = verifier.verify(DraftTree.build([r, a1, a2, b1, b2], [-1, 0, 1, 0, 3]), 5)
        verifier.commit(np.array([0, 3, 4], np.int32))
        _, after = verifier.verify(DraftTree.root_only(x), 1)
        want_a, want_b = torch_rows(prompt, [r, a1, a2]), torch_rows(prompt, [r, b1, b2, x])
        if not np.array_equal(tokens, logits.argmax(axis=1)):
            raise BackendError(f"export: the graph's argmax output {tokens.tolist()} is not the argmax of its "
                               f"logits {logits.argmax(axis=1).tolist()}")
        for what, got, want in (("branch a", logits[:3], want_a), ("branch b", logits[3:], want_b[1:3]),
                                ("after commit([0, 3, 4])", after, want_b[3:])):
            err = relative_error(got, want)
            if not err <= tolerance:   # also catches NaN
                raise BackendError(f"export: ONNX Runtime's tree logits disagree with PyTorch at {what}: "
                                   f"relative error {err:.3g} > {tolerance:g}; the export is wrong (the model "
                                   f"may rebuild its attention mask instead of using the 4-D one)")
            worst = max(worst, err)
    return worst


def _tree_forward(model, n_layers: int):
    """The model's forward with flat tensors in and out (what the ONNX exporter traces)."""
    import torch
    from transformers import DynamicCache

    from .transformers_cache import cache_keyword, returned_cache

    keyword = cache_keyword(model)

    class TreeForward(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, position_ids, attention_mask, *past):
            cache = DynamicCache()
            for i in range(n_layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                             use_cache=True, **{keyword: cache})
            presents = []
            for layer in returned_cache(out).layers:
                presents += [layer.keys, layer.values]
            return (out.logits, out.logits.argmax(-1).to(torch.int32), *presents)

    # eval(): a new Module starts in training mode, and the exporter restores the module's mode when
    # it is done, which would leave the caller's model in training mode (dropout on).
    return TreeForward().eval()


def _load(model_or_dir, dtype):
    import torch

    if isinstance(model_or_dir, (str, os.PathLike)):
        from transformers import AutoModelForCausalLM
        folder = Path(model_or_dir)
        if not folder.is_dir():
            raise ConfigError(f"model_or_dir: expected a transformers model or a local model folder, got "
                              f"{str(folder)!r}, which is not a folder")
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype or "float32"),
                                                     attn_implementation="sdpa",
                                                     local_files_only=True)
        return model.eval()
    if not callable(getattr(model_or_dir, "forward", None)) or getattr(model_or_dir, "config", None) is None:
        raise ConfigError(f"model_or_dir: expected a transformers causal LM or a folder, got {describe(model_or_dir)}")
    if getattr(model_or_dir, "training", False):
        raise ConfigError(f"model_or_dir: {type(model_or_dir).__name__} is in training mode; call model.eval() first")
    own = str(next(model_or_dir.parameters()).dtype).removeprefix("torch.")
    if dtype is not None and own != dtype:
        raise ConfigError(f"dtype: {dtype!r} asked for, but the model is {own}; pass dtype=None or a model in {dtype}")
    return model_or_dir


def _write_metadata(path: Path, values: dict) -> None:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    for key, value in values.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".onnx") as tmp:
        pass
    onnx.save(proto, tmp.name)
    os.replace(tmp.name, path)


@contextlib.contextmanager
def legacy_exporter():
    """Silence the DeprecationWarnings torch (2.9+) gives every call of its TorchScript exporter: the
    choice is deliberate, since the dynamo exporter needs onnxscript, which draftcore does not
    depend on, and the tree export traces one fixed forward, which the TorchScript exporter does."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.onnx")
        warnings.filterwarnings("ignore", message="You are using the legacy TorchScript-based ONNX export",
                                category=DeprecationWarning)
        yield
