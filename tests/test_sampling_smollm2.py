"""SmolLM2-135M-Instruct (fp32, CPU, HF backend): speculative sampling matches plain sampling.

200 speculative samples (4 short prompts x 50 seeds, 16 new tokens, T=0.7, top-p=0.9, one trie
per prompt carried across its samples so drafts are accepted) against 200 samples of transformers'
own `model.generate(do_sample=True)` with the same settings. Compared, with two-sample tests
stratified by prompt:
    mean log-probability of a sample under the processed distribution (draftcore's processors on
        the raw logits each method computed for its own tokens)     stratified z-test, |z| < 4
    distinct-2 within a sample                                      stratified z-test, |z| < 4
    distinct-1 / distinct-2 across the samples of a prompt          permutation test, p > 1e-3
A model this size cannot be enumerated; the toy-model tests (test_sampling.py) check exactness
sequence by sequence. Runtime: ~3 min on 2 idle CPU cores (~2,000 forwards); far longer when
other processes compete for the cores (torch's threads then wait on each other).
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import draftcore  # noqa: E402
from draftcore import DraftTree, SamplingParams  # noqa: E402
from draftcore.processors import LogitsProcessor  # noqa: E402

N_PER_PROMPT = 50
NEW_TOKENS = 16
PARAMS = dict(temperature=0.7, top_p=0.9)  # transformers: top_k=0 too (its GenerationConfig default is 50)
CODE = ["def fibonacci(n):\n", "import numpy as np\n\n\ndef normalize(x):\n"]
CHAT = ["Write a haiku about the sea.", "Name three uses of a paperclip."]
Z_MAX = 4.0

pytestmark = pytest.mark.slow


def prompts(tokenizer):
    out = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in CODE]
    out += [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for q in CHAT]
    return [np.asarray(p, np.int32) for p in out]


class Recorder:
    """Wraps a verifier and keeps the raw logits row that predicted each emitted token."""

    def __init__(self, verifier):
        self._v = verifier
        self.rows = []
        self._last = None

    def __getattr__(self, name):
        return getattr(self._v, name)

    def prefill(self, prompt, n_logits=0):
        tokens, logits = self._v.prefill(prompt, n_logits)
        assert logits.shape[0] == 1, "sampling asks for the prompt's last logits row"
        self.rows = [logits[0]]
        return tokens, logits

    def verify(self, tree, n_logits=0):
        tokens, self._last = self._v.verify(tree, n_logits)
        return tokens, self._last

    def commit(self, path):
        path = np.asarray(path)
        assert path.max() < self._last.shape[0], "sampling asks for the logits of every candidate"
        self.rows.extend(self._last[path])  # row of path[j] predicted the next emitted token
        self._v.commit(path)


def log_prob(prompt, tokens, raw_rows, vocab) -> float:
    """Sum of log p(token) under the processed distribution, each row for its own prefix."""
    processor = LogitsProcessor.from_params(SamplingParams(**PARAMS), vocab)
    processor.start(prompt)
    chain = DraftTree.chain(int(prompt[-1]), tokens[:-1])
    z = processor.process_tree(np.asarray(raw_rows[:len(tokens)], np.float32), chain.tokens, chain.parents)
    z = z.astype(np.float64)
    logp = z - z.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    picked = logp[np.arange(len(tokens)), tokens]
    assert np.isfinite(picked).all(), "a sampled token has probability 0 under draftcore's processing"
    return float(picked.sum())


def distinct_ratio(seqs, n) -> float:
    """Distinct n-grams over all n-grams of `seqs` (1.0 when there are none)."""
    grams = [tuple(s[i:i + n]) for s in seqs for i in range(len(s) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def cut_at_eos(tokens, eos):
    hits = np.flatnonzero(tokens == eos)
    return tokens[:hits[0] + 1] if hits.size else tokens


def stratified_z(a_groups, b_groups) -> float:
    diff = sum(np.mean(a) - np.mean(b) for a, b in zip(a_groups, b_groups))
    var = sum(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b) for a, b in zip(a_groups, b_groups))
    return float(diff / np.sqrt(var)) if var > 0 else 0.0


def permutation_p(a_groups, b_groups, stat, n_perm=2000, seed=0) -> float:
    """Two-sided permutation p-value of sum over prompts of stat(a) - stat(b), labels shuffled
    within each prompt."""
    rng = np.random.default_rng(seed)

    def total(groups_a, groups_b):
        return sum(stat(a) - stat(b) for a, b in zip(groups_a, groups_b))

    observed = abs(total(a_groups, b_groups))
    hits = 0
    for _ in range(n_perm):
        pa, pb = [], []
        for a, b in zip(a_groups, b_groups):
            pool = list(a) + list(b)
            order = rng.permutation(len(pool))
            pa.append([pool[i] for i in order[:len(a)]])
            pb.append([pool[i] for i in order[len(a):]])
        hits += abs(total(pa, pb)) >= observed - 1e-12
    return (hits + 1) / (n_perm + 1)


def test_speculative_sampling_matches_generate_sampling(smollm2):
    model, tokenizer, verifier = smollm2
    eos = tokenizer.eos_token_id
    vocab = verifier.vocab_size
    spec, plain = dict(lp=[], seqs=[]), dict(lp=[], seqs=[])
    steps = tokens = 0
    t0 = time.perf_counter()
    for k, prompt in enumerate(prompts(tokenizer)):
        # speculative: one trie per prompt, kept across its samples (as a deployment would)
        trie = draftcore.TrieDrafter()
        lps, seqs = [], []
        for s in range(N_PER_PROMPT):
            rec = Recorder(verifier)
            result = draftcore.speculate(rec, prompt, max_new_tokens=NEW_TOKENS, drafter=trie, budget=8,
                                         eos_token_id=eos, sampling=dict(PARAMS, seed=1000 * k + s))
            lps.append(log_prob(prompt, result.tokens, rec.rows, vocab))
            seqs.append(result.tokens.tolist())
            steps += result.stats.steps
            tokens += result.stats.new_tokens
        spec["lp"].append(lps)
        spec["seqs"].append(seqs)
        # plain: transformers' sampling, batched (the prompt repeated, so no padding)
        torch.manual_seed(1234 + k)
        ids = torch.as_tensor(prompt, dtype=torch.long)[None].repeat(N_PER_PROMPT, 1)
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0,
                                 max_new_tokens=NEW_TOKENS, eos_token_id=eos, pad_token_id=eos,
                                 output_logits=True, return_dict_in_generate=True, **PARAMS)
        raw = torch.stack(out.logits, 1).float().numpy()  # [batch, steps, vocab]
        lps, seqs = [], []
        for b in range(N_PER_PROMPT):
            toks = cut_at_eos(out.sequences[b, ids.shape[1]:].numpy().astype(np.int32), eos)
            lps.append(log_prob(prompt, toks, raw[b], vocab))
            seqs.append(toks.tolist())
        plain["lp"].append(lps)
        plain["seqs"].append(seqs)
        del out, raw
        print(f"prompt {k}: spec mean log-prob {np.mean(spec['lp'][-1]):.3f}, plain {np.mean(lps):.3f}; "
              f"{time.perf_counter() - t0:.0f} s so far", file=sys.stderr)

    assert tokens / steps > 1.2, f"speculation accepted too little to test anything: {tokens / steps:.2f} tokens/step"
    z_lp = stratified_z(spec["lp"], plain["lp"])
    z_d2 = stratified_z([[distinct_ratio([s], 2) for s in g] for g in spec["seqs"]],
                        [[distinct_ratio([s], 2) for s in g] for g in plain["seqs"]])
    p_d1 = permutation_p(spec["seqs"], plain["seqs"], lambda g: distinct_ratio(g, 1))
    p_d2 = permutation_p(spec["seqs"], plain["seqs"], lambda g: distinct_ratio(g, 2), seed=1)
    summary = (f"mean log-prob spec {np.mean(spec['lp']):.3f} vs plain {np.mean(plain['lp']):.3f} (z={z_lp:.2f}); "
               f"within-sample distinct-2 z={z_d2:.2f}; corpus distinct-1 p={p_d1:.3f}, distinct-2 p={p_d2:.3f}; "
               f"tokens/step {tokens / steps:.2f}")
    print(summary)
    assert abs(z_lp) < Z_MAX, summary
    assert abs(z_d2) < Z_MAX, summary
    assert p_d1 > 1e-3 and p_d2 > 1e-3, summary
