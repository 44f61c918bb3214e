"""llama.cpp backend: `LlamaCppVerifier` (one llama_decode per draft tree) and a float32 GGUF writer.

llama_cpp is imported only when a verifier is built, so this package imports without it.

    from draftcore.adapters.llamacpp import LlamaCppVerifier
    verifier = LlamaCppVerifier.from_gguf("model.gguf", n_ctx=4096)      # tree-capable context
    verifier = LlamaCppVerifier.from_llama(llm)                         # an existing llama_cpp.Llama
"""
from .gguf_writer import permute_qk, write_llama_gguf, write_tiny_llama_gguf
from .verifier import ChainOnlyWarning, LlamaCppVerifier

__all__ = ["LlamaCppVerifier", "ChainOnlyWarning", "write_llama_gguf", "write_tiny_llama_gguf", "permute_qk"]
