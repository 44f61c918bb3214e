"""What a prompt costs through the llama.cpp drop-in, against plain `llama_cpp.Llama`, by vocabulary size.

    .venv/bin/python benchmarks/llamacpp_prompt_cost.py [--vocabs 49152,128256,262144] [--lengths 100,500]
                                                        [--n 3] [--reps 3] [--threads 2]

For each vocabulary (SmolLM2-135M-Instruct Q4_1, padded to that size by draftcore/tools/padded_vocab.py
where it is larger than its own 49,152: the same prompts and answers, an output head that size), three
Llamas over the same GGUF and settings (flash attention, a Q8_0 KV cache):

    plain              llama_cpp.Llama: what the user runs today
    speculative_llama  the drop-in (a SpeculativeLlama): the prompt's last row of logits only
    hand-built         Llama(draft_model=DraftcoreDraftModel(), logits_all=True): every row computed
                       and copied, as llama-cpp-python does once a draft model is attached

A prompt's cost is the time to its first token: `next(llm.generate(prompt))` after `llm.reset()`
(the prompt's evaluation and one sampling; a draft model is first called after that). Prompts are
slices of Python's reference documentation (pydoc_data) of --lengths tokens; each prompt runs every
Llama in turn, --reps times, and keeps each Llama's median. Per vocabulary and length: the median ms
and the ratio to plain over the --n prompts.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time

# llama_cpp before anything of draftcore's loads numba (draftcore.adapters.llamacpp's docstring)
from draftcore.adapters.llamacpp import DraftcoreDraftModel, SpeculativeLlama  # isort: skip
import llama_cpp  # isort: skip

import numpy as np
from _common import write_json

from draftcore.tools.backends.default_model import default_gguf
from draftcore.tools.padded_vocab import padded_vocab_gguf
from draftcore.tools.report import make_report, show_table

SMOLLM2_VOCAB = 49152
HEADER = ["vocabulary", "prompt tokens", "prompts", "plain ms (median)", "speculative_llama ms",
          "speculative_llama / plain", "hand-built ms", "hand-built / plain"]


@functools.lru_cache(maxsize=1)
def document_ids() -> tuple:
    """Python's reference documentation (pydoc_data) tokenised by SmolLM2's GGUF tokenizer (a
    vocab-only Llama: no weights loaded); padding the vocabulary leaves the tokenizer as it was."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[key] for key in sorted(topics))
    tokenizer = llama_cpp.Llama(default_gguf(), vocab_only=True, verbose=False)
    return tuple(tokenizer.tokenize(text.encode(), add_bos=False))


def prompts_of(length: int, n: int) -> list[list[int]]:
    """`n` token-id slices of `length` tokens from `document_ids()`, spread over the document."""
    ids = list(document_ids())
    step = max(length, (len(ids) - length) // max(n, 1))
    return [ids[i * step: i * step + length] for i in range(n)]


def first_token_ms(llm, prompt: list[int]) -> float:
    llm.reset()
    start = time.perf_counter()
    generator = llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0)
    next(generator)
    elapsed = time.perf_counter() - start
    generator.close()
    return 1e3 * elapsed


def llamas(path: str, settings: dict) -> dict:
    return {"plain": llama_cpp.Llama(path, **settings),
            "speculative_llama": SpeculativeLlama(path, **settings),
            "hand-built": llama_cpp.Llama(path, draft_model=DraftcoreDraftModel(self_check=False),
                                          logits_all=True, **settings)}


def measure(vocab: int, lengths, n: int, reps: int, settings: dict) -> list[list[str]]:
    path = str(default_gguf() if vocab == SMOLLM2_VOCAB else padded_vocab_gguf(default_gguf(), vocab))
    models = llamas(path, settings)
    rows = []
    for length in lengths:
        per_prompt = {name: [] for name in models}
        for prompt in prompts_of(length, n):
            for name, llm in models.items():
                first_token_ms(llm, prompt)   # warm-up: the graph for this batch size
            times = {name: [] for name in models}
            for _ in range(reps):
                for name, llm in models.items():
                    times[name].append(first_token_ms(llm, prompt))
            for name in models:
                per_prompt[name].append(statistics.median(times[name]))
        plain = np.array(per_prompt["plain"])
        spec, hand = np.array(per_prompt["speculative_llama"]), np.array(per_prompt["hand-built"])
        rows.append([f"{vocab:,}", length, n, f"{np.median(plain):.1f}", f"{np.median(spec):.1f}",
                     f"{np.median(spec / plain):.2f}x", f"{np.median(hand):.1f}", f"{np.median(hand / plain):.2f}x"])
    for llm in models.values():
        llm.close()
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocabs", default="49152,128256,262144")
    parser.add_argument("--lengths", default="100,500")
    parser.add_argument("--n", type=int, default=3, help="prompts per length")
    parser.add_argument("--reps", type=int, default=3, help="runs of each prompt per Llama (median kept)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="llamacpp_prompt_cost.json")
    args = parser.parse_args(argv)
    settings = dict(n_ctx=2048, n_batch=512, n_threads=args.threads, n_threads_batch=args.threads, flash_attn=True,
                    type_k=llama_cpp.GGML_TYPE_Q8_0, type_v=llama_cpp.GGML_TYPE_Q8_0, verbose=False)
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    for vocab in (int(x) for x in args.vocabs.split(",")):
        rows += measure(vocab, lengths, args.n, args.reps, settings)
    title = ("A prompt's evaluation (time to its first token) through the llama.cpp drop-in and a hand-built "
             "Llama(draft_model=...), against plain llama_cpp.Llama; SmolLM2-135M-Instruct Q4_1, its vocabulary "
             "padded where larger; flash attention, Q8_0 KV cache")
    tables = [show_table(title, HEADER, rows)]
    report = make_report(title, tables, settings={"threads": args.threads, "llama-cpp-python": llama_cpp.__version__})
    print("wrote", write_json(args.out, report, rows=rows))


if __name__ == "__main__":
    main()
