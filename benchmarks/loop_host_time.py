"""The decode loop's own host time per step: `draftcore.speculate` over a verifier that costs nothing.

Where a model step is a few milliseconds (llama.cpp on a CPU, a small model on a GPU), what the loop
does around the verify (drafting, the budget's choice, acceptance, the checks, the statistics) is a
share of every step that plain decoding does not pay. This measures it alone: the verifier answers
at once, as a model whose greedy output is a text (Python's reference documentation, one token per
byte) would, so the trie drafts real trees from the prompt and most of them are rejected, as on
prose. The loop's clock is simulated with llama.cpp CPU's cost shape (each node a root-only step),
so the auto budget decides as it would there; the wall time per step is the host time.

Methods: budget 0 (`nodraft`: the loop and the drafter's bookkeeping, no proposals) and the auto
budget with a TrieDrafter, both carried over the requests as the bare call's session is. Prints
median and p90 µs per step over the repetitions.

    .venv/bin/python benchmarks/loop_host_time.py [--requests 20] [--new 64] [--reps 5]
"""
import argparse
import time

import numpy as np
from _common import write_json

import draftcore
from draftcore import CostAwareBudget, TrieDrafter
from draftcore.tools.report import make_report, show_table

PROMPT = 100          # prompt tokens per request
STEP_SECONDS = 0.015  # a root-only step on the simulated clock; a tree of n nodes costs n of them


def document() -> np.ndarray:
    """Python's reference documentation (pydoc_data, in the standard library), one token per byte."""
    from pydoc_data.topics import topics
    text = "\n\n".join(topics[name].strip() for name in sorted(topics))
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)


class SimulatedClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TextVerifier:
    """A Verifier whose model greedily continues `text` from position `start` (a node off the text
    gets token 1), answering at once; each verify advances `clock` by STEP_SECONDS per node. It offers
    `advance`, as LlamaCppVerifier does, so root-only steps take the loop's one-token path."""

    vocab_size = 256
    max_tree_nodes = 64

    def __init__(self, text: np.ndarray, start: int, clock: SimulatedClock):
        self.text, self.start, self.clock = text, start, clock
        self.max_context = text.shape[0] - start - 1
        self.n_past = 0
        self._on_text = np.zeros(self.max_tree_nodes, bool)

    def prefill(self, prompt, n_logits=0):
        self.n_past = len(prompt)
        return np.array([self.text[self.start + self.n_past]], np.int32), np.zeros((n_logits, 256), np.float32)

    def verify(self, tree, n_logits=0):
        self.clock.now += STEP_SECONDS * len(tree)
        base = self.start + self.n_past
        tokens = np.ones(len(tree), np.int32)
        on_text = self._on_text
        for i in range(len(tree)):
            depth = int(tree.depths[i])
            on_text[i] = i == 0 or (on_text[tree.parents[i]] and tree.tokens[i] == self.text[base + depth])
            if on_text[i]:
                tokens[i] = self.text[base + depth + 1]
        return tokens, np.zeros((n_logits, 256), np.float32)

    def commit(self, path):
        self.n_past += len(path)

    def advance(self, token):
        """The one-token path llama.cpp's verifier offers (verify of a root-only tree + its commit)."""
        self.clock.now += STEP_SECONDS
        self.n_past += 1
        return int(self.text[self.start + self.n_past])


def run(text, budget_of, requests: int, new_tokens: int) -> tuple[float, int]:
    """(wall seconds, steps) of `requests` requests, each on its own slice of `text`, sharing one
    drafter and one budget (`budget_of()`)."""
    clock, drafter, budget = SimulatedClock(), TrieDrafter(token_limit=256), budget_of()
    seconds, steps = 0.0, 0
    for r in range(requests):
        start = r * (PROMPT + 4 * new_tokens)
        verifier = TextVerifier(text, start, clock)
        t0 = time.perf_counter()
        result = draftcore.speculate(verifier, text[start:start + PROMPT], max_new_tokens=new_tokens,
                                     drafter=drafter, budget=budget, clock=clock)
        seconds += time.perf_counter() - t0
        steps += result.stats.steps
    return seconds, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    text = document()
    methods = {"draftcore, no drafts (budget 0)": lambda: 0, "draftcore trie (auto budget)": CostAwareBudget}
    per_step = {name: [] for name in methods}
    for name, budget_of in methods.items():
        run(text, budget_of, 2, args.new)   # compile or load every kernel first
    for _ in range(args.reps):
        for name, budget_of in methods.items():
            seconds, steps = run(text, budget_of, args.requests, args.new)
            per_step[name].append(1e6 * seconds / steps)
    rows = [[name, f"{np.median(us):.0f}", f"{np.percentile(us, 90):.0f}", args.requests, args.new, args.reps]
            for name, us in per_step.items()]
    shown = show_table("", ["method", "host µs per step (median)", "p90", "requests", "new tokens", "reps"], rows)
    report = make_report("The decode loop's own host time per step (a verifier that costs nothing)", [shown])
    print("wrote", write_json("loop_host_time.json", report, microseconds_per_step=per_step))


if __name__ == "__main__":
    main()
