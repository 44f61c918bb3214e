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
from .drafters import DRAFTER_NAMES, CompositeDrafter, JacobiDrafter, NGramDrafter, RowDrafter, TrieDrafter
from .drafters.trie import TrieRequest
from .errors import BackendError, BusyError, ConfigError, DraftcoreError, InputError
from .protocols import Drafter, DraftRequest, Verifier
from .result import SpeculateResult, SpeculateStats
from .sampling import SamplingParams
from .session import Session
from .speculate import SpeculationStream, speculate, speculate_stream
from .text import IncrementalText
from .tree import DraftTree

__version__ = "0.1.0"

__all__ = [
    "speculate", "speculate_stream", "SpeculationStream", "Session", "SpeculateResult", "SpeculateStats",
    "SamplingParams", "DraftTree", "Verifier", "Drafter", "DraftRequest", "TrieDrafter", "TrieRequest",
    "NGramDrafter", "JacobiDrafter", "CompositeDrafter", "RowDrafter", "DRAFTER_NAMES", "FixedBudget", "CostAwareBudget",
    "DraftcoreError", "ConfigError", "InputError", "BackendError", "BusyError", "IncrementalText",
]
