"""ONNX Runtime backend: `OrtVerifier` over a decoder session, and `export` for tree-capable graphs.

    from draftcore.adapters.onnx import OrtVerifier, export
    export(hf_model, "smollm2-onnx")                                     # 4-D mask, in-graph argmax
    verifier = OrtVerifier("smollm2-onnx", providers=["CPUExecutionProvider"])           # tree mode
    verifier = OrtVerifier("optimum-export", providers=["CPUExecutionProvider"])         # chain mode
    verifier = OrtVerifier("genai-folder", providers=["CPUExecutionProvider"])           # chain mode
    tree_from_genai("genai-folder", "genai-tree")          # the same genai build, rewired for trees
    verifier = OrtVerifier("genai-tree", providers=["CPUExecutionProvider"])             # tree mode

Needs onnxruntime (`pip install 'draftcore[onnx]'`, or `[onnx-gpu]` for onnxruntime-gpu: the two
install into the same folder and break each other, so install one); `export` also needs torch,
transformers and onnx. `import draftcore` alone never imports any of them.
"""
try:
    import onnxruntime  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"draftcore.adapters.onnx needs onnxruntime (pip install 'draftcore[onnx]'): {exc}") from exc

from .export import check_export, export  # noqa: E402
from .rewire import tree_from_genai  # noqa: E402
from .verifier import OrtVerifier  # noqa: E402

__all__ = ["OrtVerifier", "export", "check_export", "tree_from_genai"]
