"""llama.cpp backend: `LlamaCppVerifier`, one llama_decode per draft tree (GPU offload or CPU).

    from draftcore.adapters.llamacpp import LlamaCppVerifier
    verifier = LlamaCppVerifier.from_gguf("model.gguf", n_ctx=4096)      # tree-capable context
    verifier = LlamaCppVerifier.from_llama(llm)                         # an existing llama_cpp.Llama
    llm = speculative_llama("model.gguf", n_ctx=4096)   # or: llama-cpp-python's own loop drafting with
                                                       # draftcore (a Llama subclass, SpeculativeLlama;
                                                       # chains only)

Needs llama-cpp-python (`pip install 'draftcore[llamacpp]'`); `import draftcore` alone never imports it.

Import order: this package imports `llama_cpp` before anything of draftcore's that may load numba.
A CUDA build of llama-cpp-python was seen to crash (SIGSEGV at model load) in a process where numba's
LLVM had been initialised first; `import draftcore` does not load numba (draftcore.jit), drafters
and tree kernels do when they are built. So import this package before building any drafter.
"""
import sys
import warnings

try:
    import llama_cpp
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"draftcore.adapters.llamacpp needs llama-cpp-python "
                      f"(pip install 'draftcore[llamacpp]'): {exc}") from exc


def _loaded_before(first: str, second: str) -> bool:
    """True when module `first` entered sys.modules before `second` (both loaded)."""
    names = list(sys.modules)
    return first in sys.modules and second in sys.modules and names.index(first) < names.index(second)


if _loaded_before("numba", "llama_cpp") and llama_cpp.llama_supports_gpu_offload():
    warnings.warn(
        "numba was loaded before llama_cpp, and this llama-cpp-python build offloads to a GPU: such a "
        "build has crashed (SIGSEGV at model load) in a process where numba's LLVM was initialised "
        "first. Import draftcore.adapters.llamacpp (or llama_cpp) before building any drafter or "
        "DraftTree, e.g. at the top of your program.", RuntimeWarning, stacklevel=2)

from .draft_model import DraftcoreDraftModel  # noqa: E402
from .logits_cost import AllLogitsCostWarning  # noqa: E402
from .numerics import InexactBatchWarning  # noqa: E402
from .speculative_llama import SpeculativeLlama, speculative_llama  # noqa: E402
from .verifier import ChainOnlyWarning, LlamaCppVerifier  # noqa: E402

__all__ = ["LlamaCppVerifier", "ChainOnlyWarning", "InexactBatchWarning", "AllLogitsCostWarning",
           "DraftcoreDraftModel", "SpeculativeLlama", "speculative_llama"]
