"""HuggingFace transformers (PyTorch) backend: `HFVerifier` wraps any causal LM as it is.

Needs torch and transformers (`pip install draftcore[hf]`); `import draftcore` alone never imports them.
"""
try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"draftcore.adapters.torch_hf needs torch and transformers "
                      f"(pip install 'draftcore[hf]'): {exc}") from exc

from .smollm2 import load_smollm2
from .verifier import HFVerifier

__all__ = ["HFVerifier", "load_smollm2"]
