"""Helpers shared by the benchmark scripts."""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# 80 plain greedy SmolLM2 traces recorded with `draftcore record` (benchmarks/data/README.md); EOS id 2
TRACES = os.path.join(HERE, "data", "smollm2_greedy_traces.jsonl.gz")
TRACES_EOS = 2
OUT_DIR = os.path.join(ROOT, "bench_out")


def write_json(name: str, payload) -> str:
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, name)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1, default=str)
    return path


def markdown_table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
