"""Backends, each a Verifier over one framework; each imports its framework lazily."""
