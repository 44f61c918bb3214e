"""Backends for the cross-backend consistency suite: the same tiny random Llama (fp32) held by every
installed backend, each made the way its users make it.

    hf                  HFVerifier over the transformers model
    onnx-tree           OrtVerifier over draftcore's export (tree mode)
    onnx-chain-optimum  OrtVerifier over optimum-onnx's export (2-D mask: chain mode)
    onnx-chain-genai    OrtVerifier over onnxruntime-genai's model builder output (chain mode,
                        one KV buffer as past and present)
    onnx-tree-genai     OrtVerifier over that genai build rewired for trees (adapters/onnx/rewire.py)
    llamacpp            LlamaCppVerifier over an F32 GGUF with an f32 KV cache

A backend whose package is missing is skipped, and the skip names the package.
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # tests/: onnx_fixtures, ...
sys.path.insert(0, str(Path(__file__).resolve().parent))

from consistency_backends import VOCAB  # noqa: E402


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """(HF folder, the model): the fixtures' tiny_llama model, seed 0, saved with a tokenizer."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from onnx_fixtures import save_tiny_llama

    folder = tmp_path_factory.mktemp("tiny-hf")
    return folder, save_tiny_llama(folder, seed=0, vocab_size=VOCAB)


@pytest.fixture(scope="session")
def make_verifier(tiny_folder, tmp_path_factory):
    """make_verifier(name) -> that backend's verifier over the tiny Llama (one per name, cached)."""
    folder, model = tiny_folder
    genai_cache = tmp_path_factory.mktemp("onnx-genai-cache")   # the genai build, shared by both genai backends
    made = {}

    def build(name):
        if name == "hf":
            from draftcore.adapters.torch_hf import HFVerifier
            return HFVerifier(model)
        if name.startswith("onnx"):
            pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (draftcore[onnx])")
            pytest.importorskip("onnx", reason="onnx is not installed (draftcore[onnx])")
            from draftcore.adapters.onnx import OrtVerifier, export
            from onnx_fixtures import genai_folder, gqa_tree_folder, optimum_folder
            if name == "onnx-tree":
                path = export(model, tmp_path_factory.mktemp("onnx-tree"))
            elif name == "onnx-chain-optimum":
                path = optimum_folder(folder, tmp_path_factory.mktemp("onnx-optimum"))
            elif name == "onnx-tree-genai":
                path = gqa_tree_folder(folder, genai_cache)
            else:
                path = genai_folder(folder, genai_cache)
            return OrtVerifier(path, providers=["CPUExecutionProvider"])
        if name == "llamacpp":
            llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (draftcore[llamacpp])")
            pytest.importorskip("gguf", reason="gguf is not installed (draftcore[llamacpp])")
            from draftcore.adapters.llamacpp import LlamaCppVerifier
            from fixtures.gguf_writer import write_llama_gguf
            path = write_llama_gguf(model, tmp_path_factory.mktemp("gguf") / "tiny.gguf")
            return LlamaCppVerifier.from_gguf(path, n_ctx=512, n_seq_max=33, n_threads=1, type_k=llama_cpp.GGML_TYPE_F32,
                                              type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False)
        raise ValueError(name)

    def get(name):
        if name not in made:
            made[name] = build(name)
        return made[name]

    return get
