"""The floor: draftcore without drafts (budget 0) and the bare auto call against each backend's own
plain decoding, at about 100, 1,000 and 3,000 tokens of context.

Where drafting does not pay, draftcore must not be slower than the user's own decoding, on any
machine and at any context length. Each prompt asks for a summary of a slice of Python's reference
documentation (pydoc_data, in the standard library) cut to the context length; every method runs
every prompt, interleaved, after one short warm-up run each (with --rounds, every prompt that many
times, each round afresh and its methods' order rotated by one, keeping each prompt's median round).
Per (backend, context): median tok/s, the median and lowest per-prompt ratio to plain, the prompts
below 0.95x, tokens per step and identical outputs; then the machine and the kernel choices each
verifier made.

Plain decoding also runs a second time, last in each prompt's turn ("plain greedy, again"): its
ratios to the first run are the machine's own noise between two runs of the same thing, the yardstick
for the lowest ratio and the prompts below 0.95x of the other methods (--no-control drops it).

    .venv/bin/python benchmarks/floor.py                      # hf, llamacpp, onnx; 100,1000,3000; 3 prompts
    .venv/bin/python benchmarks/floor.py --backends hf --contexts 100,1000 --n 2 --new 32
    .venv/bin/python benchmarks/floor.py --rounds 3     # each prompt's median of 3 rounds
    .venv/bin/python benchmarks/floor.py --backends llamacpp --vocab 262144   # a large vocabulary's head

--vocab N runs the llama.cpp backend on SmolLM2 with its vocabulary padded to N tokens
(draftcore/tools/padded_vocab.py: the same prompts and greedy answers, the output head of an N-token
vocabulary); its rows read "llamacpp (vocab N)". The other backends run SmolLM2 as it is.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from _common import write_report

from draftcore.errors import ConfigError
from draftcore.tools.backends import load_backend
from draftcore.tools.bench import FLOOR, Prompt, kernel_choices, run_benchmark, summarize, with_control
from draftcore.tools.report import command_line, machine_line, make_report, table, table_text

METHODS = ("plain", "nodraft", "bare")


def document_ids(tokenizer) -> np.ndarray:
    """Python's reference documentation (pydoc_data.topics, in topic order) as token ids."""
    from pydoc_data.topics import topics
    text = "\n\n".join(topics[name].strip() for name in sorted(topics))
    return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], np.int32)


def context_prompts(tokenizer, document: np.ndarray, context: int, n: int) -> list[Prompt]:
    """`n` chat prompts of about `context` tokens: a request to summarise a slice of `document`,
    slices spread over it so that no two prompts share text."""
    def chat(text):
        message = f"Summarise the following part of Python's reference documentation:\n\n{text}"
        return tokenizer.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False)

    overhead = len(chat(""))
    length = max(context - overhead, 8)
    starts = np.linspace(0, len(document) - length, n + 1).astype(int)[:n]
    prompts = []
    for i, start in enumerate(starts):
        text = tokenizer.decode(document[start:start + length])
        prompts.append(Prompt(f"{context} tokens", i, np.asarray(chat(text), np.int32)))
    return prompts


def run_backend(name: str, contexts, n: int, new_tokens: int, hf_attn: str,
                rounds: int = 1, control: bool = True, vocab: int | None = None) -> tuple[list[list], dict]:
    backend = load_backend(name)
    options = {"llamacpp": {"n_ctx": max(contexts) + new_tokens + 256, "vocab": vocab},
               "hf": {"attn": hf_attn}}.get(name, {})
    model, tokenizer = backend.load_model(None, **options)
    methods = backend.make_methods(model, tokenizer, METHODS)
    if control:   # the same plain decoding again: how far two runs of one thing differ here
        methods = with_control(methods)
    document = document_ids(tokenizer)
    prompts = [p for context in contexts for p in context_prompts(tokenizer, document, context, n)]
    for method in methods:   # one short warm-up run each: first-call costs are no method's speed
        method.run(prompts[0].ids[:64], 8)
    records = run_benchmark(methods, prompts, new_tokens, warmup=0, rounds=rounds)
    label = name if vocab is None or name != "llamacpp" else f"{name} (vocab {vocab})"
    rows = [[label, row["dataset"], row["method"], row["prompts"], f"{row['tok_s']:.1f}", f"{row['speedup']:.2f}x",
             f"{row['speedup_all']:.2f}x", f"{row['speedup_min']:.2f}x", f"{row['below_floor']}/{row['prompts']}",
             f"{row['tokens_per_step']:.2f}", f"{row['identical']}/{row['prompts']}"]
            for row in summarize(records, baseline=methods[0].name)]
    return rows, {"records": records, "kernel_choices": kernel_choices(methods),
                  "settings": backend.model_settings(model) if hasattr(backend, "model_settings") else {}}


HEADER = ["backend", "context", "method", "prompts", "tok/s (median)", "vs plain (median)", "all tokens / all time",
          "lowest", f"prompts below {FLOOR}x", "tokens/step", "identical"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="hf,llamacpp,onnx")
    parser.add_argument("--contexts", default="100,1000,3000")
    parser.add_argument("--n", type=int, default=3, help="prompts per context length")
    parser.add_argument("--new", type=int, default=64, help="new tokens per prompt")
    parser.add_argument("--hf-attn", default="sdpa",
                        help="the HF model's attention: 'sdpa' is what from_pretrained gives users")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every prompt this many times, each round afresh; a prompt's record is its "
                             "median round (a prompt's ratio then says less about the machine's noise)")
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="skip the second run of plain decoding (the machine's noise)")
    parser.add_argument("--vocab", type=int, default=None, metavar="N",
                        help="llamacpp only: SmolLM2 with its vocabulary padded to N tokens (e.g. 262144)")
    parser.add_argument("--out", default="bench_out/floor")
    args = parser.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",")]
    if args.vocab is not None and "llamacpp" not in args.backends.split(","):
        raise ConfigError(f"--vocab: pads the llama.cpp backend's model; expected llamacpp among --backends, "
                          f"got --backends {args.backends!r}")
    rows, details = [], {}
    for name in args.backends.split(","):
        backend_rows, details[name] = run_backend(name, contexts, args.n, args.new, args.hf_attn, args.rounds,
                                                     args.control, args.vocab)
        rows += backend_rows
        print(table_text(table("", HEADER, backend_rows)), flush=True)
    rounds = f", the median of {args.rounds} rounds per prompt" if args.rounds > 1 else ""
    vocab = f", llamacpp on SmolLM2 padded to {args.vocab} tokens" if args.vocab is not None else ""
    kept = table(f"budget 0 and the bare call against plain decoding, {args.new} new tokens{rounds}{vocab}",
                 HEADER, rows)
    settings = {name: {**d["settings"], "kernel choices": d["kernel_choices"]} for name, d in details.items()}
    report = make_report("The floor: draftcore against each backend's plain decoding by context length", [kept],
                         command=command_line(sys.argv if argv is None else ["benchmarks/floor.py", *argv]),
                         settings={"kernels": json.dumps(settings)})
    print(f"\nmachine: {machine_line(report['machine'])}")
    for name, d in details.items():
        print(f"{name} kernel choices: {d['kernel_choices']}")
    print("wrote", write_report(args.out + ".json", report, records={k: d["records"] for k, d in details.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
