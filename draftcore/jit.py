"""Where draftcore's numba kernels are loaded: on first use, never at `import draftcore`.

Initialising numba's LLVM in a process that later loads a CUDA build of llama.cpp crashed it (a
segfault on the H100 machines), and `import draftcore` should cost nothing a user did not ask for.
So no module that `import draftcore` runs imports numba: the modules that hold `@njit` kernels
are imported through `kernels(name)` by the objects that need them, at construction::

    R = jit.kernels("draftcore.drafters.trie_retrieval_kernels")  # import + compile (or load the cache) once
    R.step(...)

Each kernel module defines `warm_up()`, which calls every kernel once on tiny inputs, so the compile
(or the load of numba's on-disk cache) happens there and not inside a timed decode step.

    module                                       kernels
    draftcore.tree_kernels                       ancestor mask, depths from parents
    draftcore.acceptance                         greedy walk, one step of the exact sampling walk
    draftcore.budget.kernels                     the auto budget's expected accepted tokens per tree prefix
    draftcore.processors                         repetition / presence / frequency penalties, top-k, top-p, min-p
    draftcore.drafters.trie_pool_kernels         the trie's node pool: layout, free list, decay and pruning
    draftcore.drafters.trie_count_kernels        a trie request's counting (branch inserting) and its end
    draftcore.drafters.trie_candidate_kernels    the sorted candidate list, the root's heaviest children
    draftcore.drafters.trie_calibration_kernels  calibrated scores, learnt from what came true
    draftcore.drafters.trie_retrieval_kernels    multi-stage retrieval; one decode step in one call
    draftcore.drafters.trie_check_kernels        the node pool's integrity check
    draftcore.drafters.trie_model_kernels        a trie request's learning of the model's tokens
    draftcore.drafters.ngram_kernels             n-gram tables, the order-aware hash
    draftcore.drafters.jacobi_kernels            the Jacobi window and n-gram pool
    draftcore.drafters.merge_kernels             the merge of several draft trees
    draftcore.drafters.composite_kernels         the composite's merge by calibrated priority, its counting
    draftcore.drafters.row_kernels               RowDrafter: a batch's rows matched to requests, a chain each
"""
from __future__ import annotations

import importlib
import threading

_lock = threading.Lock()
_loaded: dict = {}  # module name -> kernel module, warmed up in this process


def kernels(module_name: str):
    """The kernel module `module_name`, imported and warmed up (once per process, thread-safe;
    afterwards one dict lookup, so hot paths may call it every time)."""
    module = _loaded.get(module_name)
    if module is None:
        with _lock:
            module = _loaded.get(module_name)
            if module is None:
                module = importlib.import_module(module_name)
                module.warm_up()
                _loaded[module_name] = module
    return module
