"""A user's own prompts for `draftcore bench --prompts FILE`: a JSONL file, one request a line.

    {"prompt": "def fib(n):"}                             a text, tokenised as it is (a completion)
    {"messages": [{"role": "user", "content": "Hi"}]}     a chat, through the model's chat template
    "def fib(n):"                                         a bare JSON string: the same as {"prompt": ...}

Either object may carry an "id" (a string or an int), which the bench's JSON keeps. Blank lines are
skipped. Everything is checked when the file is read, before any model loads, so a typo on line
900 is not found after an hour of loading and running: a bad line is an InputError naming the file,
the line, the value and what was expected.

The backends turn each request into their model's token ids (their `encode_request` hook); the
file's stem names the dataset in the bench's table.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import InputError, describe
from .bench import Prompt

ROLES = ("system", "user", "assistant", "tool")
PROMPT_KEYS = ("prompt", "messages", "id")
MESSAGE_KEYS = ("role", "content")


@dataclass(frozen=True)
class UserPrompt:
    """One line of a prompt file: its request (a text, or a chat's list of {"role", "content"}
    messages), the line it came from (from 1) and its "id" (None when the line has none)."""

    request: str | list[dict]
    line: int
    id: str | int | None = None


def read_prompt_file(path) -> list[UserPrompt]:
    """Every prompt of the JSONL file at `path`, checked (module docstring); InputError for a file
    that cannot be read, holds no prompt, or has a bad line."""
    prompts = [_parse_line(text, path, number) for number, text in _numbered_lines(path)]
    if not prompts:
        raise InputError(f"prompts: {str(path)!r} holds no prompts; expected one JSON object a line, "
                         f'{{"prompt": "..."}} or {{"messages": [...]}}')
    _check_unique_ids(prompts, path)
    return prompts


def prompt_file_dataset(path) -> str:
    """The dataset name a prompt file's prompts go under in the bench's table: its name without
    the extension (`traffic.jsonl` -> `traffic`)."""
    return os.path.splitext(os.path.basename(os.fspath(path)))[0]


def prompts_to_run(prompts: Sequence[UserPrompt], path, n: int | None, warmup: int) -> list[UserPrompt]:
    """The file's first `warmup` prompts (run, not recorded) and up to `n` after them (all of them
    when `n` is None). InputError when the file leaves no prompt to record."""
    if len(prompts) <= warmup:
        raise InputError(f"prompts: {str(path)!r} holds {len(prompts)} prompt(s) and --warmup {warmup} runs the "
                         f"first {warmup} unrecorded; expected at least {warmup + 1} prompts (or a smaller --warmup)")
    return list(prompts[:len(prompts) if n is None else warmup + n])


def encode_prompts(prompts: Sequence[UserPrompt], dataset: str, encode: Callable, path) -> list[Prompt]:
    """`prompts` as the bench runs them: `encode(request)` (a backend's encode_request with its
    tokenizer) gives each one's token ids; idx is the prompt's position among `prompts`."""
    encoded = []
    for idx, prompt in enumerate(prompts):
        ids = np.asarray(encode(prompt.request), np.int32).reshape(-1)
        if ids.size == 0:
            raise InputError(f"prompts: {path}:{prompt.line}: the model's tokenizer makes no tokens of "
                             f"{describe(prompt.request)}; expected a prompt of at least one token")
        encoded.append(Prompt(dataset, idx, ids))
    return encoded


def _numbered_lines(path):
    """(line number, text) of every non-blank line, each decoded alone so that a bad byte names its line."""
    try:
        with open(path, "rb") as f:
            raw_lines = f.read().splitlines()
    except OSError as exc:
        raise InputError(f"prompts: cannot read the prompt file {str(path)!r}: {exc}") from exc
    for number, raw in enumerate(raw_lines, 1):
        try:
            text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"prompts: {path}:{number}: expected UTF-8 text, got {describe(raw)} ({exc.reason})") from None
        if text.strip():
            yield number, text


def _parse_line(text: str, path, number: int) -> UserPrompt:
    """Line `number` of the file: a JSON string, or an object with "prompt" or "messages"."""
    where = f"{path}:{number}"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"prompts: {where}: expected a JSON object or string, got {describe(text)} "
                         f"({exc.msg})") from None
    if isinstance(value, str):
        return UserPrompt(_text(value, where), number)
    if not isinstance(value, dict):
        raise InputError(f'prompts: {where}: expected a JSON object {{"prompt": ...}} or {{"messages": [...]}} '
                         f"or a string, got {describe(value)}")
    unknown = [key for key in value if key not in PROMPT_KEYS]
    if unknown or ("prompt" in value) == ("messages" in value):
        raise InputError(f'prompts: {where}: expected "prompt" or "messages" (one of them) and maybe "id", '
                         f"got the keys {list(value)}")
    request = _text(value["prompt"], where) if "prompt" in value else _messages(value["messages"], where)
    return UserPrompt(request, number, _prompt_id(value.get("id"), where))


def _text(value, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f'prompts: {where}: expected "prompt" to be a non-empty string, got {describe(value)}')
    return value


def _messages(value, where: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise InputError(f'prompts: {where}: expected "messages" to be a non-empty list of '
                         f'{{"role", "content"}} objects, got {describe(value)}')
    for i, message in enumerate(value):
        _check_message(message, f"{where}: messages[{i}]")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _check_message(message, where: str) -> None:
    if not isinstance(message, dict) or sorted(message) != sorted(MESSAGE_KEYS):
        raise InputError(f'prompts: {where}: expected an object with the keys "role" and "content" only, '
                         f"got {describe(message)}")
    if message["role"] not in ROLES:
        raise InputError(f"prompts: {where}: expected a role among {list(ROLES)}, got {describe(message['role'])}")
    if not isinstance(message["content"], str) or not message["content"].strip():
        raise InputError(f'prompts: {where}: expected "content" to be a non-empty string, '
                         f"got {describe(message['content'])}")


def _prompt_id(value, where: str):
    # bool is an int to Python, but `"id": true` is surely a mistake
    if value is None or (isinstance(value, (str, int)) and not isinstance(value, bool)):
        return value
    raise InputError(f'prompts: {where}: expected "id" to be a string or an int, got {describe(value)}')


def _check_unique_ids(prompts: Sequence[UserPrompt], path) -> None:
    """Two prompts with one id would be told apart in the JSON by position only: refused."""
    first_line = {}
    for prompt in prompts:
        if prompt.id is None:
            continue
        if prompt.id in first_line:
            raise InputError(f'prompts: {path}:{prompt.line}: expected a new "id", got {describe(prompt.id)}, '
                             f"the id of line {first_line[prompt.id]} too")
        first_line[prompt.id] = prompt.line
