"""`python -m draftcore.adapters.onnx` (also the `draftcore-onnx-export` command): export a local HF
model folder as a tree-capable ONNX decoder (export.py), checked against PyTorch before it is kept.

    draftcore-onnx-export MODEL_DIR OUT_DIR [--dtype float32|float16] [--opset 17] [--max-context N]
    draftcore-onnx-export --from-genai GENAI_DIR OUT_DIR    an onnxruntime-genai build, rewired for
                                                            trees (rewire.py), checked against itself
"""
from __future__ import annotations

import argparse
import sys

from draftcore.errors import DraftcoreError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="draftcore-onnx-export", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", help="a local transformers causal-LM folder (config.json, weights), or with "
                                          "--from-genai a folder made by onnxruntime-genai's model builder")
    parser.add_argument("out_dir", help="where model.onnx is written")
    parser.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--max-context", type=int, default=None, help="default: the model's max_position_embeddings")
    parser.add_argument("--no-self-check", action="store_true", help="skip the ONNX Runtime vs PyTorch check")
    parser.add_argument("--from-genai", action="store_true",
                        help="MODEL_DIR is an onnxruntime-genai build: rewire it for trees (--dtype, --opset and "
                             "--max-context do not apply: the build's own are kept)")
    args = parser.parse_args(argv)
    from .export import export
    from .rewire import tree_from_genai
    try:
        if args.from_genai:
            path = tree_from_genai(args.model_dir, args.out_dir, self_check=not args.no_self_check)
        else:
            path = export(args.model_dir, args.out_dir, dtype=args.dtype, opset=args.opset,
                          self_check=not args.no_self_check, max_context=args.max_context)
    except DraftcoreError as exc:
        print(f"draftcore-onnx-export: {exc}", file=sys.stderr)
        return 2
    checked = "the original genai model" if args.from_genai else "PyTorch"
    print(f"wrote {path} (checked against {checked})" if not args.no_self_check else f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
