"""vLLM: draftcore as vLLM's speculative proposer (vLLM verifies; there is no Verifier here).

    from vllm import LLM
    llm = LLM(model, speculative_config={"method": "custom_class", "num_speculative_tokens": 8,
                                         "model": "draftcore.adapters.vllm.DraftcoreProposer"})

Importing this package does not import vLLM: vLLM imports the proposer when it builds it. Options of
draftcore's own come from environment variables (options.py); see docs/scale-out.md.
"""
from .options import ProposerOptions, options_from_environment
from .proposer import TESTED_VLLM_VERSIONS, DraftcoreProposer

__all__ = ["DraftcoreProposer", "ProposerOptions", "options_from_environment", "TESTED_VLLM_VERSIONS"]
