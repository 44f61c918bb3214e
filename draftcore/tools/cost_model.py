"""Synthetic time for trace replay: what one verify of n tree nodes costs on a given machine.

A replay has no model, so it has no verify time to measure; the cost-aware budget (the library's
default) decides from step times. A `CostModel` prices each verify from a table measured on a real
machine, and a `SimulatedClock` that the replay's verifier advances is passed to `speculate` as its
clock: the auto budget then sees the costs it would see on that machine, and the same replay makes
the same choices every time.

Built-in tables, milliseconds per forward by nodes in it (the root included):

    hf-cpu        HFVerifier, SmolLM2-135M fp32, transformers, this project's 2-core CPU (its
                  Linear layers through oneDNN on packed weights, benchmarks/hf_verify_cost.py)
    hf-cpu-unpacked  the same with packed_linear=False (the table of every replay before it)
    hf-cpu-avx2   HFVerifier on another 2-core AMD EPYC of the same kind, with AVX2 only, where plain
                  decoding ran 10-40 % slower and a tree cost more against a one-token step: verify +
                  commit of a chain after a 100-token prefill, the Linear plan its construction chose
                  (benchmarks/hf_kernel_race.py, 2026-11-28); 16 nodes cost 2.2 one-node steps
    hf-cpu-avx512  HFVerifier on a third 2-core AMD EPYC, with AVX-512: its verify by tree size after
                  a 200-token prefill (benchmarks/hf_verify_cost.py --reps 15, 2026-12-01); 16 nodes
                  cost 1.35 one-node steps
    llamacpp-cpu  LlamaCppVerifier, SmolLM2-135M Q4_1, llama.cpp 0.3.36, the same CPU: a whole step
                  (benchmarks/llamacpp_decode_ms.py's verify plus ~0.6 ms of loop, as the auto
                  budget measured it); a 2-token forward costs twice a 1-token one
    llamacpp-cpu-old  the table of every replay before that (an older llama.cpp build)
    onnx-cpu      OrtVerifier, SmolLM2-135M fp32, draftcore's tree export, onnxruntime's CPU EP on the
                  AVX-512 EPYC: verify + commit of the root after a 200-token prefill
                  (benchmarks/onnx_verify_cost.py, 2026-12-06); 16 nodes cost 1.6 one-node steps
    hf-cuda-h200  HFVerifier, SmolLM2-135M fp32, transformers 5.17, torch 2.11 (CUDA 13), one NVIDIA
                  H200 (benchmarks/gpu_check.py, 2026-11-27): 64 nodes cost what one does (a forward
                  there waits on Python, not on the GPU); the medians of 4 and 8 nodes came out ~50 %
                  above the rest, not explained (the check now measures the table again after its runs)
    gpu-flat      a GPU as it was guessed before any was measured (a verify of 64 nodes ~10 % above one)

Between two sizes of a table the cost is interpolated linearly; beyond its largest size it is
extrapolated from its last two entries (a flat extension would make big trees free).
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError

COST_TABLES: dict[str, dict[int, float]] = {
    "hf-cpu": {1: 20.8, 2: 23.4, 4: 25.0, 8: 29.3, 16: 34.9, 32: 49.2, 64: 77.6},
    "hf-cpu-unpacked": {1: 46.0, 2: 43.9, 3: 57.4, 4: 55.1, 6: 72.5, 8: 77.7, 16: 99.0, 32: 132.7},
    "hf-cpu-avx2": {1: 79.7, 2: 103.0, 4: 106.7, 8: 136.1, 16: 172.8},
    "hf-cpu-avx512": {1: 49.8, 2: 49.8, 4: 64.0, 8: 52.0, 16: 67.1, 32: 93.2, 64: 153.3},
    "llamacpp-cpu": {1: 5.4, 2: 11.2, 3: 15.7, 4: 16.6, 8: 25.8, 16: 43.0, 32: 79.0},
    "llamacpp-cpu-old": {1: 7.2, 2: 12.2, 4: 16.2, 8: 25.3, 11: 31.9, 16: 45, 32: 85, 64: 165},
    "onnx-cpu": {1: 18.32, 2: 20.3, 4: 22.1, 8: 24.91, 16: 29.62, 32: 39.98, 64: 60.33},
    "hf-cuda-h200": {1: 19.98, 2: 18.76, 4: 29.58, 8: 31.79, 16: 19.60, 32: 20.31, 64: 19.83},
    "gpu-flat": {1: 10, 64: 11, 128: 13},
}


class CostModel:
    """Seconds per verify by tree size, from a table {nodes: milliseconds}."""

    def __init__(self, ms_by_nodes: dict, name: str = "custom"):
        table = _checked_table(ms_by_nodes)
        self.name = name
        self.ms_by_nodes = table
        self._nodes = np.array(list(table), float)
        self._seconds = np.array(list(table.values()), float) / 1e3

    @classmethod
    def named(cls, spec) -> "CostModel":
        """A CostModel from a built-in table's name, a table "nodes:ms,nodes:ms,...", or a CostModel."""
        if isinstance(spec, CostModel):
            return spec
        if isinstance(spec, str) and spec in COST_TABLES:
            return cls(COST_TABLES[spec], spec)
        if isinstance(spec, str) and ":" in spec:
            return cls(_parse_table(spec), spec)
        raise ConfigError(f"cost: expected one of {list(COST_TABLES)} or a table 'nodes:ms,nodes:ms,...', "
                          f"got {spec!r}")

    def seconds(self, n_nodes: int) -> float:
        """Seconds of one forward over `n_nodes` tokens."""
        nodes, seconds = self._nodes, self._seconds
        if n_nodes > nodes[-1] and nodes.shape[0] > 1:
            slope = (seconds[-1] - seconds[-2]) / (nodes[-1] - nodes[-2])
            return float(seconds[-1] + slope * (n_nodes - nodes[-1]))
        return float(np.interp(n_nodes, nodes, seconds))

    def __repr__(self) -> str:
        return f"CostModel({self.name!r})"


class SimulatedClock:
    """A clock for `speculate(clock=...)` that only moves when a verifier is charged for a forward."""

    def __init__(self, cost: CostModel):
        self.cost = cost
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def charge(self, n_nodes: int) -> None:
        self.now += self.cost.seconds(n_nodes)


def _parse_table(spec: str) -> dict[int, float]:
    try:
        pairs = [item.split(":") for item in spec.split(",") if item.strip()]
        return {int(nodes): float(ms) for nodes, ms in pairs}
    except ValueError:
        raise ConfigError(f"cost: expected a table 'nodes:ms,nodes:ms,...' (e.g. '1:46,8:78,32:133'), "
                          f"got {spec!r}") from None


def _checked_table(ms_by_nodes) -> dict[int, float]:
    if not isinstance(ms_by_nodes, dict) or not ms_by_nodes:
        raise ConfigError(f"cost: expected a non-empty table {{nodes: milliseconds}}, got {ms_by_nodes!r}")
    table = dict(sorted((int(n), float(ms)) for n, ms in ms_by_nodes.items()))
    if min(table) < 1 or not all(ms > 0 and np.isfinite(ms) for ms in table.values()):
        raise ConfigError(f"cost: expected node counts >= 1 and positive milliseconds, got {ms_by_nodes!r}")
    return table
