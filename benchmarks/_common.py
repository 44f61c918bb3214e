"""Helpers shared by the benchmark scripts: the recorded traces, and where results go."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# the test fixtures (a toy model, the tiny Llama, the GGUF writer, the naive trie) live in tests/fixtures,
# outside the installed package: a benchmark imports them as `fixtures.<name>`, as the tests do
sys.path.insert(0, os.path.join(ROOT, "tests"))
# 80 plain greedy SmolLM2 traces recorded with `draftcore record` (benchmarks/data/README.md); EOS id 2
TRACES = os.path.join(HERE, "data", "smollm2_greedy_traces.jsonl.gz")
TRACES_EOS = 2
OUT_DIR = os.path.join(ROOT, "bench_out")


def write_json(name: str, report: dict, **data) -> str:
    """Write bench_out/NAME: the run's report (draftcore.tools.report.make_report: what
    `draftcore results` renders into docs/results.md) beside the script's own data; return its path."""
    return write_report(os.path.join(OUT_DIR, name), report, **data)


def write_report(path: str, report: dict, **data) -> str:
    """Write the report and the script's own data to `path` (its folder made if missing); return it."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"report": report, **data}, f, indent=1, default=str)
    return path
