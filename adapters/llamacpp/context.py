"""Create llama.cpp contexts that can hold a draft tree, and read what an existing context can do.

A tree batch tags each token with several sequence ids (one per leaf below it), so the context needs

    setting        value                 why
    kv_unified     True                  one cell pool shared by all sequences: a cell tagged with
                                         several ids is one cell, seen by every one of them
    n_seq_max      >= leaves + 1         seq 0 is the committed context, seq k + 1 is leaf k
    n_batch        >= tree nodes         the whole tree goes into ONE llama_decode
    logits         per token             the batch's `logits` flags ask for every node's row

`llama_cpp.Llama` cannot set kv_unified or n_seq_max (only its embedding mode does), so a tree
context is made here with the low-level API: from a GGUF path, or next to an existing `Llama`,
sharing its loaded weights.
"""
from __future__ import annotations

import ctypes
import numbers
import os
from dataclasses import dataclass

from draftcore.errors import BackendError, ConfigError


def import_llama_cpp():
    """The llama_cpp module, or a ConfigError saying how to install it."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise ConfigError("the llama.cpp backend needs llama-cpp-python: "
                          "pip install 'draftcore[llamacpp]'") from exc
    return llama_cpp


# llama.cpp's and llama-cpp-python's default n_batch: the most tokens one llama_decode takes unless a
# deployment says otherwise, so the most a draft can hold and still be verified in one forward.
DEFAULT_N_BATCH = 512


@dataclass(frozen=True)
class Limits:
    """What a context allows, read back from llama.cpp (not from what was asked for)."""

    n_ctx: int       # cells in the KV cache
    n_batch: int     # most tokens one llama_decode takes
    n_seq_max: int   # sequence ids 0 .. n_seq_max - 1
    unified: bool    # one cell pool for all sequences

    @property
    def max_leaves(self) -> int:
        """Leaves a tree may have in tree mode (0: chains only)."""
        return self.n_seq_max - 1 if self.unified and self.n_seq_max > 1 else 0


def read_limits(lib, ctx) -> Limits:
    n_ctx = int(lib.llama_n_ctx(ctx))
    n_seq_max = int(lib.llama_n_seq_max(ctx))
    # A split (non-unified) cache gives each sequence n_ctx / n_seq_max cells; unified gives all.
    unified = n_seq_max == 1 or int(lib.llama_n_ctx_seq(ctx)) == n_ctx
    return Limits(n_ctx=n_ctx, n_batch=int(lib.llama_n_batch(ctx)), n_seq_max=n_seq_max, unified=unified)


def default_threads() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def tree_context_params(lib, base=None, *, n_ctx=None, n_batch=None, n_seq_max: int, n_threads=None,
                        type_k=None, type_v=None, flash_attn=None, overrides=None):
    """llama_context_params for a tree context: `base` (copied, e.g. an existing Llama's) or the
    defaults, with the tree settings and any explicit overrides applied."""
    params = lib.llama_context_default_params() if base is None else type(base).from_buffer_copy(base)
    if n_ctx is not None:
        set_fields(params, {"n_ctx": n_ctx})
    if n_batch is not None:
        set_fields(params, {"n_batch": n_batch, "n_ubatch": n_batch})  # one tree, one graph evaluation
    # llama.cpp aborts the process (GGML_ASSERT in output_reserve) when n_batch exceeds n_ctx.
    params.n_batch = min(params.n_batch, params.n_ctx)
    params.n_ubatch = min(params.n_ubatch, params.n_batch)
    if n_threads is not None:
        set_fields(params, {"n_threads": n_threads, "n_threads_batch": n_threads})
    if type_k is not None:
        params.type_k = check_kv_type(lib, "type_k", type_k)
    if type_v is not None:
        params.type_v = check_kv_type(lib, "type_v", type_v)
    if flash_attn is not None and not isinstance(flash_attn, bool):
        raise ConfigError(f"flash_attn: expected True, False or None (llama.cpp's automatic choice), "
                          f"got {flash_attn!r}")
    if flash_attn is not None:
        params.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                                  else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    if n_seq_max > lib.llama_max_parallel_sequences():
        raise ConfigError(f"n_seq_max: expected at most {lib.llama_max_parallel_sequences()} "
                          f"(llama_max_parallel_sequences), got {n_seq_max}")
    # llama.cpp also aborts when n_seq_max exceeds n_outputs_max (0 = n_batch). Clamping loses
    # nothing: a tree must fit one batch, and n nodes have at most n - 1 leaves.
    outputs = params.n_outputs_max or params.n_batch
    params.n_seq_max = min(n_seq_max, outputs)
    params.kv_unified = True
    params.embeddings = False
    set_fields(params, overrides or {})
    return params


# The KV cache types llama.cpp offers (its --cache-type-k/-v choices); any other ggml type id aborts
# the process or crashes it at context creation.
KV_CACHE_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "IQ4_NL", "Q5_0", "Q5_1")
# ggml's ids (ggml.h's enum, fixed) of the types llama-cpp-python has no constant for: it defines no
# GGML_TYPE_BF16 (0.3.36), though llama.cpp takes a BF16 cache (exact past 256 tokens: numerics.py).
GGML_TYPE_IDS = {"BF16": 30}


def check_kv_type(lib, name: str, value) -> int:
    """`value` as one of llama.cpp's KV cache ggml types, or ConfigError naming `name`."""
    allowed = {getattr(lib, "GGML_TYPE_" + t, GGML_TYPE_IDS.get(t)): t for t in KV_CACHE_TYPES}
    allowed.pop(None, None)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) not in allowed:
        choices = ", ".join(f"{'llama_cpp.' if hasattr(lib, 'GGML_TYPE_' + t) else ''}GGML_TYPE_{t} ({v})"
                            for v, t in sorted(allowed.items()))
        raise ConfigError(f"{name}: expected a KV cache type, one of {choices}; got {value!r}")
    return int(value)


_INTEGER_FIELDS = (ctypes.c_int8, ctypes.c_uint8, ctypes.c_int16, ctypes.c_uint16, ctypes.c_int32, ctypes.c_uint32,
                   ctypes.c_int64, ctypes.c_uint64, ctypes.c_int, ctypes.c_uint, ctypes.c_long, ctypes.c_ulong)


def set_fields(params, values: dict) -> None:
    """Set ctypes struct fields by name; a value the field's C type cannot take is a ConfigError
    (ctypes would raise a bare TypeError, silently truncate a float, or silently wrap an integer out
    of the field's range: n_ctx=2**32 + 512 made a context of 512 cells)."""
    types = dict((f[0], f[1]) for f in type(params)._fields_)
    for name, value in values.items():
        try:
            if types.get(name) in _INTEGER_FIELDS:
                _check_integer(types[name], value)
            setattr(params, name, value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ConfigError(f"{name}: llama.cpp's field takes a {getattr(types.get(name), '__name__', '?')}, "
                              f"got {value!r} ({exc})") from None


def _check_integer(ctype, value) -> None:
    """TypeError unless `value` is an integer, ValueError unless the ctypes integer type `ctype`
    holds it without wrapping."""
    if isinstance(value, (float, bool)) or not isinstance(value, numbers.Integral):
        raise TypeError("not an integer")
    bits = 8 * ctypes.sizeof(ctype)
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if ctype(-1).value < 0 else (0, (1 << bits) - 1)
    if not low <= value <= high:
        raise ValueError(f"outside [{low}, {high}]")


def split_overrides(lib, kwargs: dict) -> tuple[dict, dict]:
    """Sort extra keyword arguments into llama_model_params and llama_context_params fields."""
    model_fields = {f[0] for f in lib.llama_model_params._fields_}
    context_fields = {f[0] for f in lib.llama_context_params._fields_}
    model_kw, context_kw = {}, {}
    for name, value in kwargs.items():
        if name in context_fields:
            context_kw[name] = value
        elif name in model_fields:
            model_kw[name] = value
        else:
            raise ConfigError(f"{name}: not a field of llama_context_params or llama_model_params "
                              f"(llama-cpp-python {lib.__version__})")
    return model_kw, context_kw


def load_model(lib, path, *, n_gpu_layers: int, overrides: dict):
    """Load a GGUF model; returns the llama_model pointer (free with llama_model_free)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"path: expected the path of a GGUF file (str or os.PathLike), got {path!r}")
    if not os.path.exists(path):
        raise ConfigError(f"path: no such GGUF file: {path}")
    params = lib.llama_model_default_params()
    set_fields(params, {"n_gpu_layers": n_gpu_layers, **overrides})
    lib.llama_backend_init()
    model = lib.llama_model_load_from_file(os.fsencode(path), params)
    if not model:
        raise BackendError(f"llama.cpp could not load the model file {path}")
    return model


def offloads_layers(lib, n_gpu_layers: int) -> bool:
    """Whether a model loaded with `n_gpu_layers` runs any layer on a GPU."""
    return n_gpu_layers != 0 and bool(lib.llama_supports_gpu_offload())


def new_context(lib, model, params):
    """A llama_context over `model` (free with llama_free)."""
    ctx = lib.llama_init_from_model(model, params)
    if not ctx:
        raise BackendError(f"llama.cpp could not create a context (n_ctx={params.n_ctx}, "
                           f"n_seq_max={params.n_seq_max}, n_batch={params.n_batch})")
    return ctx
