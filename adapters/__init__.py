"""Backends: a Verifier over each framework, and for vLLM a proposer (vLLM verifies itself); each
imports its framework lazily."""
