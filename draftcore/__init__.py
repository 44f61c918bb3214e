"""draftcore: lossless speculative decoding for existing LLM deployments.

    import draftcore
    result = draftcore.speculate(verifier, prompt_ids, max_new_tokens=128)
    result = draftcore.speculate(verifier, prompt_ids, sampling=dict(temperature=0.7, top_p=0.9, seed=0))

The runtime needs numpy and numba only, and `import draftcore` does not even load numba: kernels
compile (or load from numba's cache) when the first object that needs them is built (draftcore.jit).
Backends live in draftcore.adapters.<backend> and import their framework when they are imported
themselves; the benchmark harness and the CLI live in draftcore.tools.
"""
from .budget import CostAwareBudget, FixedBudget
from .drafters import DRAFTER_NAMES, CompositeDrafter, JacobiDrafter, NGramDrafter, TrieDrafter
from .errors import BackendError, BusyError, ConfigError, DraftcoreError, InputError
from .protocols import BudgetPolicy, Drafter, DraftRequest, Verifier
from .result import SpeculateResult, SpeculateStats
from .sampling import SamplingParams
from .session import Session
from .speculate import speculate, speculate_stream
from .tree import DraftTree

__version__ = "0.1.0"

# What users and backend authors need. Everything else stays importable from its own module:
# draftcore.drafters.trie.TrieRequest, draftcore.drafters.rows.RowDrafter, draftcore.loop.SpeculationStream,
# draftcore.text.IncrementalText, draftcore.drafters.register_drafter, ...
__all__ = [
    "speculate", "speculate_stream", "Session", "SpeculateResult", "SpeculateStats", "SamplingParams", "DraftTree",
    "Verifier", "Drafter", "DraftRequest", "BudgetPolicy",
    "TrieDrafter", "NGramDrafter", "JacobiDrafter", "CompositeDrafter", "DRAFTER_NAMES", "FixedBudget", "CostAwareBudget",
    "DraftcoreError", "ConfigError", "InputError", "BackendError", "BusyError",
]
