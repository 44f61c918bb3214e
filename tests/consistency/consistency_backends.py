"""The backends of the consistency suite (conftest.py builds them)."""
BACKENDS = ("hf", "onnx-tree", "onnx-tree-genai", "onnx-chain-optimum", "onnx-chain-genai", "llamacpp")
TREE_BACKENDS = ("hf", "onnx-tree", "onnx-tree-genai", "llamacpp")
VOCAB = 512   # llama.cpp's dummy vocabulary needs specials + 256 byte tokens
