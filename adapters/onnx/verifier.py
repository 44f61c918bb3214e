"""`OrtVerifier`: an ONNX Runtime decoder session behind draftcore's Verifier protocol.

Two modes, read from the graph's inputs (graph.py) and reported by `mode`:

- "tree": draftcore's own export (export.py). One run per draft tree: every node at position
  n_past + depth, a 4-D additive mask letting it see the context and its ancestors; the argmax of
  every node comes from the graph (a greedy step copies n ints to the host).
- "chain": the exports people already run (optimum-onnx's decoder, the model.onnx of a folder built
  by onnxruntime-genai's model builder). Their 2-D attention mask is causal, so a verify holds one
  branch: `max_tree_leaves` is 1 and the loop cuts every tree to its best chain (the candidates'
  longest best-first prefix that is a chain), lookahead windows dropped. Commit keeps a prefix.

The KV cache stays where the session runs (IO binding; kv.py): a verify binds it as the past inputs
and gets past + tree rows back; a commit keeps the context and the accepted path with a Gather on
the same providers. A graph that reads and writes one preallocated KV buffer (onnxruntime-genai's
models, `past_present_share_buffer` in genai_config.json) runs with that buffer bound as past and
present (kv.SharedCache), as onnxruntime-genai itself runs it: a step writes only its own rows and a
chain commit costs nothing. Providers are always explicit: ONNX Runtime's own default order silently picks
whatever the installed build has.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from draftcore.checks import check_n_logits, check_path, check_tree
from draftcore.committed_tokens import CommittedTokens
from draftcore.errors import BackendError, ConfigError, InputError, describe
from draftcore.tree import DraftTree
from draftcore.validate import flag, positive_int, token_array, tokenizer_or_none

from . import graph
from .kv import RowGather, SharedCache, empty_cache

# Relative error a correct k-token forward shows against one-token decoding is ~1e-6 in fp32 on the
# CPU EP (tiny Llama and SmolLM2, measured); a graph that ignores the tree mask is off by > 0.05.
_TOLERANCE = {np.float32: 1e-3, np.float16: 3e-2}
# The CUDA EP runs float32 matmuls in TF32 unless its `use_tf32` option is "0" (on Ampere and later):
# fp16's 10-bit mantissa, and a k-token run takes other GEMM kernels than one-token decoding. On an
# H200 a correct tree export's branch came out 1.2e-3 off; a graph that ignores the mask is off by > 0.05.
_TF32_TOLERANCE = 1e-2


def self_check_tolerance(session, kv_dtype) -> float:
    """The relative error a correct k-token run may show against one-token decoding in `session`."""
    cuda = session.get_provider_options().get("CUDAExecutionProvider")
    if kv_dtype == np.float32 and cuda is not None and str(cuda.get("use_tf32", "1")) != "0":
        return _TF32_TOLERANCE
    return _TOLERANCE[kv_dtype]


class OrtVerifier:
    """Verifier over an ONNX decoder (`mode` "tree" or "chain", see the module docstring).

    model: an `onnxruntime.InferenceSession`, a .onnx file, or a folder holding one (model.onnx, or
        the decoder named in an onnxruntime-genai folder's genai_config.json).
    providers: required unless `model` is a session, e.g. ["CPUExecutionProvider"] or
        [("CUDAExecutionProvider", {"device_id": 0})]; each must be available in the installed
        onnxruntime build.
    max_context: the most positions the cache may hold; default read from the file (export.py's
        metadata), genai_config.json (context_length) or config.json (max_position_embeddings).
    self_check: at construction, run a branching tree (tree mode) or a chain with a partial commit
        (chain mode) and compare with one-token decoding through the same session.
    tokenizer: optional, with encode/decode: `speculate` then takes and returns text.
    share_buffer: bind one KV buffer as past and present (chain mode only). None (default): on when
        the folder's genai_config.json says `past_present_share_buffer` (onnxruntime-genai models).
        The self-check compares it with the copying path before it is trusted.
    reuse_prefix: True (default): `prefill` keeps the cached KV of the longest prefix the new prompt
        shares with the tokens in the cache (the last request's prompt and what was committed after
        it) and runs only the rest, as HFVerifier does: a shared system prompt or tool schema, or a
        chat's earlier turns, is computed once. Either kind of graph runs a prompt under its mask as
        it runs the rest behind kept positions, so keeping a prefix never adds attention work.
        `prefix_reused` says how many tokens the last prefill kept. False: every prefill runs the
        whole prompt.
    """

    def __init__(self, model, *, providers=None, session_options=None, max_context: int | None = None,
                 self_check: bool = True, tokenizer=None, share_buffer: bool | None = None,
                 reuse_prefix: bool = True):
        import onnxruntime as ort

        self._reuse_prefix = flag("reuse_prefix", reuse_prefix)
        self_check = flag("self_check", self_check)   # bool("no") is True: no coercion
        tokenizer = tokenizer_or_none("tokenizer", tokenizer)

        self._ort = ort
        session, folder = _open(ort, model, providers, session_options)
        self._session = session
        self.interface = graph.read_interface(session)
        self.mode = self.interface.mode
        self.max_tree_leaves = 1 if self.mode == graph.CHAIN else None
        self._device, self._device_id = _device_of(session.get_providers(), session.get_provider_options())
        meta = session.get_modelmeta().custom_metadata_map
        self._vocab_size = _vocab_size(self.interface, folder)
        self._head_dim = _head_dim(self.interface, folder)
        self._max_context = _max_context(max_context, meta, folder)
        self._tokenizer = tokenizer
        iface = self.interface
        self._gather = RowGather(ort, 2 * iface.n_layers, iface.kv_dtype, session.get_providers(), self._device,
                                 self._device_id)
        self._mask_min = (np.finfo(iface.mask_dtype).min if np.issubdtype(iface.mask_dtype, np.floating) else None)
        self._outputs = (["argmax"] if iface.has_argmax else []) + ["logits", *iface.present_names]
        self._present_index = {name: i for i, name in enumerate(iface.present_names)}
        self._shared = None
        if _shares_buffer(share_buffer, self.mode, folder):
            self._shared = SharedCache(ort, 2 * iface.n_layers, iface.kv_heads, self._head_dim, iface.kv_dtype,
                                       session.get_providers(), self._device, self._device_id, self._max_context)
        self._use_shared = self._shared is not None
        self._committed = CommittedTokens(self._max_context)   # the cache's tokens (what a prefill may keep)
        self._runs = 0
        self.reset()
        if self_check:
            self._self_check()
            self.reset()   # the check's sequence is not the caller's to reuse
        self._runs = 0   # the self-check's runs are not the caller's

    # ---------------------------------------------------------------- protocol attributes

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def n_past(self) -> int:
        return self._n_past

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def kv_dtype(self):
        """numpy dtype of the KV cache (and of a tree export's mask)."""
        return self.interface.kv_dtype

    @property
    def session(self):
        return self._session

    @property
    def shares_buffer(self) -> bool:
        """Whether the KV cache is one buffer bound as past and present (module docstring)."""
        return self._shared is not None

    @property
    def runs(self) -> int:
        """Decoder runs since construction (prefill and verifies; the self-check's excluded)."""
        return self._runs

    # ---------------------------------------------------------------- protocol methods

    def prefill(self, prompt, n_logits: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Start a new sequence from `prompt` (int32[T], 1 <= T <= max_context); returns the last
        position's (int32[1] argmax, float32[n_logits, vocab]) with n_logits 0 or 1."""
        n_logits = check_n_logits(n_logits, 1)
        prompt = token_array("prompt", prompt, self._vocab_size)
        if prompt.shape[0] > self._max_context:
            raise InputError(f"prompt: {prompt.shape[0]} tokens exceed max_context {self._max_context}")
        keep = self._shared_prefix(prompt)
        kept = None
        if keep and not self._use_shared:   # a shared buffer keeps its rows where they are
            kept = self._gather.keep(self._cache, np.arange(keep, dtype=np.int64))
        self.reset()   # before the run: a failing one leaves an empty verifier, not a cut one
        chain = DraftTree.chain(int(prompt[keep]), prompt[keep + 1:])
        self._cache, self._n_past = kept, keep
        try:
            tokens, logits, presents = self._forward(chain, want_rows=(chain.tokens.shape[0] - 1, n_logits))
        except BaseException:
            self.reset()
            raise
        self._cache, self._n_past, self._prefix_reused = presents, int(prompt.shape[0]), keep
        self._committed.record(prompt[keep:], keep)
        return tokens[-1:], logits

    @property
    def prefix_reused(self) -> int:
        """Prompt tokens whose cached KV the last `prefill` kept (reuse_prefix), 0 for a fresh one."""
        return self._prefix_reused

    def cached_prefix(self, prompt) -> int:
        """How many leading tokens of `prompt` (int32[T]) a prefill would keep now; changes nothing."""
        return self._shared_prefix(token_array("prompt", prompt, self._vocab_size))

    def _shared_prefix(self, prompt: np.ndarray) -> int:
        """Leading tokens of `prompt` that equal the cached ones (at most T - 1: the last position's
        logits need a run); 0 without reuse_prefix or a sequence."""
        if not self._reuse_prefix or self._n_past == 0:
            return 0
        return self._committed.shared_prefix(prompt, self._n_past)

    def verify(self, tree: DraftTree, n_logits: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """One run over every node of `tree` (tree mode) or over a chain (chain mode: a branching
        tree is refused, max_tree_leaves is 1). Returns (int32[n] each node's argmax,
        float32[n_logits, vocab] the first n_logits nodes' logits)."""
        if self._cache is None:
            raise InputError("tree: verify() was called before prefill(); prefill the prompt first")
        check_tree(tree, self._vocab_size)
        n = len(tree)
        n_logits = check_n_logits(n_logits, n)
        if self.mode == graph.CHAIN and not tree.is_chain():
            raise InputError(f"tree: a branching tree of {n} nodes; this verifier's graph takes a 2-D "
                             f"attention_mask (chain mode, max_tree_leaves=1): pass a chain, or export the "
                             f"model with draftcore.adapters.onnx.export for trees")
        if self._n_past + n > self._max_context:
            raise InputError(f"tree: n_past ({self._n_past}) + {n} tree nodes = {self._n_past + n} "
                             f"exceed max_context {self._max_context}")
        self._pending = None
        tokens, logits, presents = self._forward(tree, want_rows=(0, n_logits))
        self._pending = (tree, presents)
        return tokens, logits

    def commit(self, path) -> None:
        """Keep the KV of `path` (root first, each node the parent of the next) after the context."""
        if self._pending is None:
            raise InputError("path: commit() needs a verified tree; call verify() first "
                             "(each verified tree can be committed once)")
        tree, presents = self._pending
        path = check_path(path, tree)
        k, n = path.shape[0], len(tree)
        if self._use_shared:   # a chain's path is its prefix: rows n_past .. n_past + k - 1 are in place
            self._cache = presents
        elif k == n:   # the whole tree is the path (a fully accepted chain): the presents as they are
            self._cache = presents
        else:
            rows = np.concatenate([np.arange(self._n_past, dtype=np.int64), self._n_past + path.astype(np.int64)])
            self._cache = self._gather.keep(presents, rows)
        self._committed.record(tree.tokens[path], self._n_past)
        self._n_past += k
        self._pending = None

    def reset(self) -> None:
        """Forget the sequence: empty cache, n_past 0, no pending tree."""
        self._cache, self._n_past, self._pending, self._prefix_reused = None, 0, None, 0

    # ---------------------------------------------------------------- text

    @property
    def encode(self):
        if self._tokenizer is None:
            raise AttributeError("encode: this OrtVerifier was built without a tokenizer")
        return lambda text: np.asarray(self._tokenizer.encode(text), dtype=np.int32)

    @property
    def decode(self):
        if self._tokenizer is None:
            raise AttributeError("decode: this OrtVerifier was built without a tokenizer")
        return lambda ids: self._tokenizer.decode(token_array("ids", ids, allow_empty=True).tolist())

    # ---------------------------------------------------------------- the forward

    def _forward(self, tree: DraftTree, want_rows: tuple[int, int]):
        """Run `tree` after the cache; return (int32 argmax of every node, float32 logits rows
        want_rows[0] .. want_rows[0] + want_rows[1] - 1, the presents as OrtValues)."""
        iface, n, n_past = self.interface, len(tree), self._n_past
        if self._use_shared:
            self._shared.reserve(n_past + n)
            cache = self._shared.values
        else:
            cache = self._cache if self._cache is not None else empty_cache(
                self._ort, iface.n_layers, iface.kv_heads, self._head_dim, iface.kv_dtype, self._device,
                self._device_id)
        binding = self._session.io_binding()
        binding.bind_cpu_input("input_ids", tree.tokens.astype(np.int64)[None])
        if iface.has_position_ids:
            binding.bind_cpu_input("position_ids", tree.position_ids(n_past).astype(np.int64)[None])
        binding.bind_cpu_input("attention_mask", self._mask(tree, n_past))
        for name, value in zip(iface.past_names, cache):
            binding.bind_ortvalue_input(name, value)
        for name in self._outputs:
            on_host = name == "argmax"
            if self._use_shared and name in self._present_index:   # the present writes into its past buffer
                binding.bind_ortvalue_output(name, cache[self._present_index[name]])
            else:
                binding.bind_output(name, "cpu" if on_host else self._device, 0 if on_host else self._device_id)
        self._runs += 1
        try:
            self._session.run_with_iobinding(binding)
        except Exception as exc:
            raise BackendError(f"onnxruntime: the decoder run failed ({n} nodes after {n_past}): "
                               f"{type(exc).__name__}: {exc}") from exc
        outputs = binding.get_outputs()
        first, count = want_rows
        if iface.has_argmax:
            tokens = outputs[0].numpy()[0].astype(np.int32, copy=False)
            logits_value, presents = outputs[1], outputs[2:]
            rows = logits_value.numpy()[0, first:first + count] if count else None
        else:
            logits_value, presents = outputs[0], outputs[1:]
            all_rows = logits_value.numpy()[0]
            tokens = all_rows.argmax(axis=1).astype(np.int32)
            rows = all_rows[first:first + count] if count else None
        logits = (np.ascontiguousarray(rows, np.float32) if rows is not None
                  else np.empty((0, self._vocab_size), np.float32))
        if self._use_shared:
            presents = cache
        expected = self._shared.capacity if self._use_shared else n_past + n
        got = presents[0].shape()[2]
        if got != expected:
            raise BackendError(f"onnxruntime: {iface.present_names[0]} holds {got} positions after a run of {n} "
                               f"nodes on {n_past}, expected {expected}")
        return tokens, logits, presents

    def _mask(self, tree: DraftTree, n_past: int) -> np.ndarray:
        if self.mode == graph.CHAIN:
            return np.ones((1, n_past + len(tree)), self.interface.mask_dtype)
        n = len(tree)
        mask = np.zeros((1, 1, n, n_past + n), self.interface.mask_dtype)
        mask[0, 0, :, n_past:][~tree.ancestor_mask()] = self._mask_min
        return mask

    # ---------------------------------------------------------------- construction check

    def _self_check(self) -> None:
        from draftcore.selfcheck import check_tree_attention, plain_decoding_logits, relative_error

        tolerance = self_check_tolerance(self._session, self.interface.kv_dtype)
        if self.mode == graph.TREE:
            check_tree_attention(self, tolerance, name=f"OrtVerifier ({self.mode} mode)",
                                 hint="Export the model with draftcore.adapters.onnx.export.")
        else:
            rng = np.random.default_rng(0)
            prompt = rng.integers(0, self._vocab_size, 6).astype(np.int32)
            r, a1, a2, x = (int(t) for t in rng.integers(0, self._vocab_size, 4))
            self.prefill(prompt)
            _, chain_logits = self.verify(DraftTree.chain(r, [a1, a2]), 3)
            self.commit(np.array([0, 1], np.int32))
            _, after = self.verify(DraftTree.root_only(x), 1)
            shared, self._use_shared = self._use_shared, False   # the reference copies past into present
            try:
                want = plain_decoding_logits(self, prompt, [r, a1, a2])
                want_after = plain_decoding_logits(self, prompt, [r, a1, x])[2:]
            finally:
                self._use_shared = shared
            err = max(relative_error(chain_logits, want), relative_error(after, want_after))
            if not err <= tolerance:
                how = " with one KV buffer as past and present (share_buffer=False turns it off)" if shared else ""
                raise BackendError(f"OrtVerifier (chain mode): a 3-token run{how} disagrees with one-token "
                                   f"decoding (relative error {err:.3g} > {tolerance:g}), or the commit kept the "
                                   f"wrong rows")
        self.reset()

    def __repr__(self) -> str:
        return (f"OrtVerifier(mode={self.mode}, providers={self._session.get_providers()}, layers="
                f"{self.interface.n_layers}, n_past={self._n_past}, max_context={self._max_context})")


# -------------------------------------------------------------------- construction helpers

def _open(ort, model, providers, session_options):
    """(session, the folder its files came from or None)."""
    if isinstance(model, ort.InferenceSession):
        if providers is not None:
            raise ConfigError("providers: a session was given, whose providers are already set; pass the "
                              "providers when creating the session")
        return model, None
    if providers is None:
        raise ConfigError(f"providers: expected an explicit list such as ['CPUExecutionProvider'], got None "
                          f"(available here: {ort.get_available_providers()})")
    if isinstance(providers, str) or not isinstance(providers, (list, tuple)) or not providers:
        raise ConfigError(f"providers: expected a non-empty list of provider names or (name, options) pairs, "
                          f"got {describe(providers)}")
    available = ort.get_available_providers()
    for entry in providers:
        name = entry[0] if isinstance(entry, tuple) else entry
        if name not in available:
            raise ConfigError(f"providers: {name!r} is not available in this onnxruntime build "
                              f"(available: {available}); install onnxruntime-gpu for CUDAExecutionProvider")
    path = Path(model) if isinstance(model, (str, Path)) else None
    if path is None:
        raise ConfigError(f"model: expected an onnxruntime.InferenceSession, a .onnx file or a folder, got "
                          f"{describe(model)}")
    folder = path if path.is_dir() else path.parent
    if path.is_dir():
        path = _decoder_file(path)
    if not path.is_file():
        raise ConfigError(f"model: {str(path)!r} does not exist")
    if session_options is None:   # the caller's options are used as given, never changed
        session_options = ort.SessionOptions()
        session_options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(path), session_options, providers=list(providers))
    except Exception as exc:
        raise ConfigError(f"model: onnxruntime cannot load {str(path)!r}: {type(exc).__name__}: {exc}") from exc
    return session, folder


def _decoder_file(folder: Path) -> Path:
    genai = folder / "genai_config.json"
    if genai.is_file():
        name = json.loads(genai.read_text()).get("model", {}).get("decoder", {}).get("filename", "model.onnx")
        return folder / name
    for name in ("model.onnx", "decoder_model_merged.onnx", "decoder_with_past_model.onnx"):
        if (folder / name).is_file():
            return folder / name
    raise ConfigError(f"model: no model.onnx (or genai_config.json) in folder {str(folder)!r}")


def _device_of(providers, options) -> tuple[str, int]:
    if providers and providers[0] == "CUDAExecutionProvider":
        return "cuda", int(options.get("CUDAExecutionProvider", {}).get("device_id", 0))
    return "cpu", 0


def _vocab_size(iface, folder) -> int:
    if iface.vocab_size is not None:
        return iface.vocab_size
    config = _json(folder, "config.json")
    if "vocab_size" in config:
        return positive_int("config.json vocab_size", config["vocab_size"])
    genai = _json(folder, "genai_config.json").get("model", {})
    if "vocab_size" in genai:
        return positive_int("genai_config.json vocab_size", genai["vocab_size"])
    raise ConfigError("model: the logits output has no static vocabulary size and no config.json says it")


def _head_dim(iface, folder) -> int:
    """The KV rows' width: static in the graph, else genai_config.json's head_size, else config.json."""
    if iface.head_dim is not None:
        return iface.head_dim
    decoder = _json(folder, "genai_config.json").get("model", {}).get("decoder", {})
    if "head_size" in decoder:
        return positive_int("genai_config.json head_size", decoder["head_size"])
    config = _json(folder, "config.json")
    if "head_dim" in config:
        return positive_int("config.json head_dim", config["head_dim"])
    if "hidden_size" in config and "num_attention_heads" in config:
        return positive_int("config.json hidden_size // num_attention_heads",
                            config["hidden_size"] // config["num_attention_heads"])
    raise ConfigError(f"model: {iface.past_names[0]} has a symbolic head dimension and no genai_config.json or "
                      f"config.json beside the model says it")


def _max_context(explicit, meta: dict, folder) -> int:
    if explicit is not None:
        return positive_int("max_context", explicit)
    if "draftcore.max_context" in meta:
        return positive_int("metadata draftcore.max_context", int(meta["draftcore.max_context"]))
    genai = _json(folder, "genai_config.json").get("model", {})
    if "context_length" in genai:
        return positive_int("genai_config.json context_length", genai["context_length"])
    config = _json(folder, "config.json")
    if "max_position_embeddings" in config:
        return positive_int("config.json max_position_embeddings", config["max_position_embeddings"])
    raise ConfigError("max_context: not recorded in the model (no draftcore metadata, genai_config.json or "
                      "config.json); pass max_context=")


def _json(folder, name: str) -> dict:
    if folder is None or not (Path(folder) / name).is_file():
        return {}
    return json.loads((Path(folder) / name).read_text())


def _shares_buffer(requested, mode: str, folder) -> bool:
    if requested is None:
        search = _json(folder, "genai_config.json").get("search", {})
        return mode == graph.CHAIN and search.get("past_present_share_buffer") is True
    if not isinstance(requested, bool):
        raise ConfigError(f"share_buffer: expected True, False or None, got {describe(requested)}")
    if requested and mode != graph.CHAIN:
        raise ConfigError("share_buffer: True needs a chain-mode graph whose attention writes into its past "
                          "buffer (onnxruntime-genai's GroupQueryAttention models); this graph is in tree mode")
    return requested
