"""A CPU tree forward's Linear layers through oneDNN, each weight packed once into its blocked layout.

torch runs `F.linear(x, W)` on CPU through MKL, which for a few rows either streams W through a
GEMV (one row) or packs (copies) all of W on every call (a GEMM), and on this project's 2-core AMD
EPYC reaches ~70 GFLOP/s at 8 rows. oneDNN, which torch ships and which its own CPU compiler
(inductor) uses for Linear layers, multiplies by a weight reordered once into its blocked layout.
All 211 Linear layers of SmolLM2-135M (fp32, weights cold in cache as in decoding; median ms):

    rows                       1     2     4     8    16    32    64
    F.linear(x, W) (MKL)     23.0  31.4  34.4  35.6  45.6  62.5     -
    W @ x.T (weight_major)   23.0  10.6  12.0  27.8  31.9  47.4     -
    oneDNN, packed once       8.8   9.1   9.7  11.9  15.2  23.4  38.8

and a whole verify (HFVerifier, n_past ~200): 1 node 27.2 → 20.8 ms, 8 → 54.7 → 28.0,
16 → 70.9 → 34.0, 64 → 152.3 → 78.4. A tree of 16 nodes then costs 1.6x one node instead of
2.6x, which is what makes drafting deeper trees pay on a CPU.

The same machine on a later day (2026-11-26: plain decoding as fast as before, but reading memory
slower) measured all 211 layers at 1 row 48.0 (MKL) against 38.7 (packed) ms, at 8 rows 63.5
against 33.5, and a whole one-token verify through the packed weights no faster than `W @ x.T`.
Which way wins at which size moves with the machine's state, so the verifier times them at
construction and runs each tree size the fastest way (head.py, `_packed_plan`).

The price is memory: a second copy of every packed weight (SmolLM2-135M: 538 MB), so the verifier
packs by default only where that copy fits comfortably (`fits_in_memory`). The copies are taken at
construction. A weight changed in place afterwards through autograd-visible operations (`copy_`
under no_grad, `load_state_dict`, an optimizer step) bumps its version counter and is packed again
before its next use; a write through `.data` is invisible to torch's counters, so after one build a
new verifier. A weight that is replaced (a new Parameter) is not packed and runs through torch as
usual. Verifiers of one model share one packed copy (`share`): a pool of them costs it once.

`PackedLinearMode` is a `torch.overrides.TorchFunctionMode` (the documented scoped override, on the
calling thread only): the model, its modules and torch are not modified, and any `F.linear` whose
weight was not packed passes through unchanged. `torch.ops.mkldnn._reorder_linear_weight` and
`_linear_pointwise` are the two operators inductor emits for a CPU Linear; `available()` checks they
exist in the installed torch, and head.py checks the logits against the model's own forward.
"""
from __future__ import annotations

import os
import threading
import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

# oneDNN reorders a weight for an expected batch size; the layout it picks for 16 rows serves 1-64
# rows as well as any other hint measured here (1: slower at every size; 8 and 16: equal).
_HINT_ROWS = 16
_MEMORY_SHARE = 0.25   # auto mode packs only while the copies need at most this share of free memory
_shared: "weakref.WeakKeyDictionary[torch.nn.Module, PackedLinears]" = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def available() -> bool:
    """Whether this torch build has oneDNN and the two operators used here."""
    ops = getattr(torch.ops, "mkldnn", None)
    return (torch.backends.mkldnn.is_available() and ops is not None
            and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))


class PackedLinears:
    """oneDNN-packed copies of the float32 CPU weights of `linears` (torch.nn.Linear modules)."""

    def __init__(self, linears):
        self._packed: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}   # id -> weight, version, packed
        for weight in _packable_weights(linears):
            self._packed[id(weight)] = (weight, weight._version, _pack(weight))
        self.nbytes = _nbytes(w for w, _, _ in self._packed.values())
        self.head = None   # the head `share` kept them with

    @classmethod
    def of(cls, *modules) -> "PackedLinears":
        """Pack every float32 CPU Linear inside `modules` (a decoder, a head)."""
        return cls(_linears(modules))

    def __len__(self) -> int:
        return len(self._packed)

    def mode(self) -> "PackedLinearMode":
        """`with packed.mode():` routes F.linear of a packed weight to its packed copy."""
        return PackedLinearMode(self)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias=None):
        """`F.linear(x, weight, bias)` through the packed copy; None when `weight` was not packed
        (or x does not match it), left to torch."""
        entry = self._packed.get(id(weight))
        if entry is None or entry[0] is not weight or x.dtype != weight.dtype or x.device.type != "cpu" \
                or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
            return None
        if entry[1] != weight._version:   # changed in place since it was packed
            entry = self._packed[id(weight)] = (weight, weight._version, _pack(weight))
        if bias is not None and (bias.dtype != x.dtype or bias.device.type != "cpu"):
            return None
        return torch.ops.mkldnn._linear_pointwise(x, entry[2], bias, "none", [], "")


class PackedLinearMode(TorchFunctionMode):
    """Inside `with PackedLinears.mode():`, `F.linear` of a packed weight runs through oneDNN."""

    def __init__(self, packed: PackedLinears):
        super().__init__()
        self._packed = packed

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            out = self._packed.linear(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def shared(decoder, head) -> PackedLinears | None:
    """The copies `share` kept for this decoder and head, or None: every verifier of a model uses
    the same ones (read-only but for re-packing a changed weight, which any thread may do)."""
    with _shared_lock:
        packed = _shared.get(decoder)
        return packed if packed is not None and packed.head is head else None


def share(decoder, head, packed: PackedLinears) -> None:
    """Keep `packed` (checked and in use) for the next verifier of this decoder, while it lives.
    Copies that were made but not used are not kept: they would hold the weights' memory again."""
    with _shared_lock:
        packed.head = head
        _shared[decoder] = packed


def fits_in_memory(nbytes: int) -> bool:
    """Whether `nbytes` more is at most a quarter of the memory available now (True where unknown)."""
    available = _available_memory()
    return available is None or nbytes <= _MEMORY_SHARE * available


def _available_memory() -> int | None:
    """Linux's MemAvailable (free memory plus the page cache it can drop: a model file just read
    fills that cache), else free pages by sysconf, else None."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def linear_bytes(*modules) -> int:
    """Bytes of the float32 CPU Linear weights inside `modules` (what PackedLinears would copy)."""
    return _nbytes(_packable_weights(_linears(modules)))


def _linears(modules) -> list:
    return [m for module in modules for m in module.modules() if type(m) is torch.nn.Linear]


def _packable_weights(linears) -> list:
    """The distinct packable weights of `linears` (a tied weight once)."""
    weights = {}
    for linear in linears:
        if _packable(linear.weight):
            weights.setdefault(id(linear.weight), linear.weight)
    return list(weights.values())


def _nbytes(weights) -> int:
    return sum(w.numel() * w.element_size() for w in weights)


def _packable(weight) -> bool:
    return (type(weight) in (torch.Tensor, torch.nn.Parameter) and weight.dim() == 2
            and weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.numel() > 0)


def _pack(weight: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _HINT_ROWS)
