"""HuggingFace transformers (PyTorch) backend: `HFVerifier` wraps any causal LM as it is.

`model.generate(..., custom_generate=speculative_generate)` is the same inside transformers' own
generate() (generate.py). Needs torch and transformers (`pip install draftcore[hf]`); `import draftcore` alone never imports them.
"""
try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"draftcore.adapters.torch_hf needs torch and transformers "
                      f"(pip install 'draftcore[hf]'): {exc}") from exc

from .generate import speculative_generate
from .gqa_attention import NAME as GROUPED_SDPA, register as _register_grouped_sdpa
from .smollm2 import load_smollm2
from .verifier import HFVerifier
from .verifier_pool import release

_register_grouped_sdpa()   # attn_implementation="draftcore_sdpa" (load_smollm2's default; gqa_attention.py)

__all__ = ["HFVerifier", "load_smollm2", "speculative_generate", "release", "GROUPED_SDPA"]
