"""Validation at the public boundary: check once here, trust inside."""
import functools
import math
import os

import numpy as np

from .errors import ConfigError, InputError, describe
from .jit import kernels

_INT32_MAX = int(np.iinfo(np.int32).max)


def token_array(name: str, value, vocab_size: int | None = None, allow_empty: bool = False) -> np.ndarray:
    """Return `value` as a contiguous 1-D int32 array of token ids, or raise InputError.

    Accepts int32 arrays as they are and other integer sequences (lists, int64 arrays) when every
    value fits; floats, bools and objects are refused rather than silently truncated.
    """
    if isinstance(value, np.ndarray) and value.dtype == np.int32 and value.ndim == 1 \
            and value.flags.c_contiguous and (value.shape[0] or allow_empty):
        # Fast path for arrays that already have the contract's layout (the decode loop's own): one
        # jitted pass (kernels load on first use, never at import).
        upper = vocab_size if vocab_size is not None else _INT32_MAX
        if kernels("draftcore.tree_kernels").tokens_in_range(value, upper):
            return value
    if isinstance(value, np.ndarray):
        arr = value
    else:
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError) as exc:
            raise InputError(f"{name}: expected a 1-D sequence of int token ids, got {describe(value)}") from exc
        if arr.size == 0:
            arr = arr.astype(np.int32)
    if arr.ndim != 1:
        raise InputError(f"{name}: expected a 1-D array of token ids, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise InputError(f"{name}: expected dtype=int32 token ids, got dtype={arr.dtype}")
    if arr.size == 0 and not allow_empty:
        raise InputError(f"{name}: expected at least one token id, got an empty array")
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        upper = vocab_size if vocab_size is not None else np.iinfo(np.int32).max
        if lo < 0 or hi >= upper:
            bad = lo if lo < 0 else hi
            raise InputError(f"{name}: token id {bad} is outside the vocabulary [0, {upper})")
    return np.ascontiguousarray(arr, dtype=np.int32)


def flag(name: str, value) -> bool:
    """Return `value` as a bool, or raise ConfigError: bool("False") is True, so no coercion."""
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{name}: expected True or False, got {describe(value)}")
    return bool(value)


def tokenizer_or_none(name: str, value):
    """Return `value` (None, or something with callable encode and decode), or raise ConfigError:
    checked at construction, so a wrong object fails there, not as an AttributeError mid-call."""
    if value is not None and not (callable(getattr(value, "encode", None)) and callable(getattr(value, "decode", None))):
        raise ConfigError(f"{name}: expected None or a tokenizer with encode(text) and decode(ids) methods "
                          f"(e.g. a transformers tokenizer), got {describe(value)}")
    return value


def positive_int(name: str, value, minimum: int = 1) -> int:
    """Return `value` as an int >= minimum, or raise ConfigError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{name}: expected an int >= {minimum}, got {describe(value)}")
    if value < minimum:
        raise ConfigError(f"{name}: expected an int >= {minimum}, got {value}")
    return int(value)


def positive_float(name: str, value, minimum: float = 0.0, inclusive: bool = False) -> float:
    """Return `value` as a float > minimum (>= when inclusive), or raise ConfigError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{name}: expected a number, got {describe(value)}")
    ok = value >= minimum if inclusive else value > minimum
    if not ok or not np.isfinite(value):
        sign = ">=" if inclusive else ">"
        raise ConfigError(f"{name}: expected a finite number {sign} {minimum}, got {value}")
    return float(value)


def cost_or_inf(name: str, value) -> float:
    """Return `value` as a float >= 0, or math.inf itself (a share of a step's cost whose rule it
    turns off); else raise ConfigError."""
    if isinstance(value, float) and value == math.inf:
        return value
    return positive_float(name, value, inclusive=True)


@functools.cache
def physical_memory() -> int | None:
    """This machine's physical memory in bytes (os.sysconf), None where the OS does not say."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * page_size if pages > 0 and page_size > 0 else None


def fits_in_memory(nbytes: int, what: str, **options) -> None:
    """Raise ConfigError, naming `options` (name=value, the arguments that size it), where `what`
    would take `nbytes` bytes, more than this machine's physical memory. Such arrays cannot be
    built: trying ends in a MemoryError after seconds of work or, where pages are only mapped as
    they are touched (np.zeros), in a machine that swaps until it hangs long after construction."""
    memory = physical_memory()
    if memory is not None and nbytes > memory:
        named = ", ".join(f"{name}={value}" for name, value in options.items())
        raise ConfigError(f"{named}: {what} would take {nbytes:,} bytes, more than this machine's physical memory "
                          f"({memory:,} bytes); expected a smaller value")


@functools.cache
def max_tree_nodes() -> int:
    """The most nodes a draft tree may have on this machine. One verify builds the tree's n x n
    ancestor mask (DraftTree.ancestor_mask: n^2 bytes; HF and ONNX widen it to an n x (n_past + n)
    float mask, llama.cpp reads its leaves' sequence ids from it), so past isqrt(physical memory)
    nodes that mask alone cannot be built and no backend can verify the tree in one step: a budget,
    a window or a propose() asking for more is a mistake, refused before anything is allocated for
    it. Where the OS does not say its memory: the int32 node ids' limit."""
    memory = physical_memory()
    return math.isqrt(memory) if memory is not None else _INT32_MAX


def tree_size(name: str, value, minimum: int = 0) -> int:
    """`value` (a number of draft-tree nodes) as an int in [minimum, max_tree_nodes()], or ConfigError."""
    value = positive_int(name, value, minimum)
    within_tree_limit(name, value, value)
    return value


def within_tree_limit(name: str, value, nodes: int) -> None:
    """Raise ConfigError where `value` of the option `name` asks for trees of `nodes` nodes, more than
    one verify can hold on this machine (max_tree_nodes)."""
    limit = max_tree_nodes()
    if nodes > limit:
        memory = physical_memory()
        why = (f"the tree's n x n ancestor mask alone would exceed this machine's physical memory ({memory:,} bytes)"
               if memory is not None else "draft trees index their nodes with int32")
        raise ConfigError(f"{name}: {value} asks for trees of {nodes:,} nodes; expected at most {limit:,}: past "
                          f"that {why}, so no backend can verify such a tree in one step")
