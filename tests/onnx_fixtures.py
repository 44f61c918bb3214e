"""ONNX models of the tiny random Llama made by the tools users make them with, offline.

    save_tiny_llama(folder, seed, vocab_size)  an HF folder: the tiny Llama and a word-level tokenizer
                                               (the model builder needs one it can load)
    genai_folder(hf_folder, cache_dir)         onnxruntime-genai's model builder (adapters/onnx/builds.py)
    gqa_tree_folder(hf_folder, cache_dir)      that build rewired for tree mode (adapters/onnx/rewire.py)
    optimum_folder(hf_folder, out_dir)         optimum-onnx's `optimum-cli export onnx --task
                                               text-generation-with-past`, run by the separate venv
                                               that `make test` builds (.venv-optimum): optimum-onnx
                                               0.1.0 needs transformers < 4.58, draftcore's venv has 5.x

Each returns a folder, or calls pytest.skip naming the missing package. Also plain_greedy(verifier,
prompt, n_new): greedy decoding through a verifier, one token per verify.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fixtures.tiny_llama import save_tiny_llama  # noqa: F401  (the tests import it from here)

REPO = Path(__file__).resolve().parent.parent
OPTIMUM_PYTHON = Path(os.environ.get("DRAFTCORE_OPTIMUM_PYTHON", REPO / ".venv-optimum" / "bin" / "python"))


def plain_greedy(verifier, prompt, n_new):
    from draftcore.tree import DraftTree

    out = [int(verifier.prefill(np.asarray(prompt, np.int32))[0][0])]
    while len(out) < n_new:
        out.append(int(verifier.verify(DraftTree.root_only(out[-1]))[0][0]))
        verifier.commit(np.array([0], np.int32))
    return np.array(out, np.int32)


def genai_folder(hf_folder, cache_dir) -> Path:
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (draftcore[onnx-genai])")
    from draftcore.adapters.onnx.builds import genai_build
    return genai_build(hf_folder, cache_dir=cache_dir)


def gqa_tree_folder(hf_folder, cache_dir) -> Path:
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (draftcore[onnx-genai])")
    from draftcore.adapters.onnx.builds import gqa_tree_build
    return gqa_tree_build(hf_folder, cache_dir=cache_dir)


def optimum_folder(hf_folder, out_dir) -> Path:
    if not OPTIMUM_PYTHON.is_file():
        pytest.skip(f"optimum-onnx is not installed: no {OPTIMUM_PYTHON} (make test builds .venv-optimum, or set "
                    f"DRAFTCORE_OPTIMUM_PYTHON to a python that has optimum-onnx)")
    out_dir = Path(out_dir)
    command = [str(OPTIMUM_PYTHON), "-m", "optimum.commands.optimum_cli", "export", "onnx", "--model",
               str(hf_folder), "--task", "text-generation-with-past", str(out_dir)]
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert done.returncode == 0, f"optimum-cli export failed:\n{done.stderr[-3000:]}"
    return out_dir
