"""The README's Python blocks, as code a test can run.

    python_blocks(path)          -> [(heading, code), ...] for every ```python fence, in order
    substitute_model(code, model) -> code with the one marked model variable set to `model`
    quickstart(backend, model)   -> the runnable quickstart of "hf", "llamacpp" or "onnx", model substituted

A quickstart names the user's model in exactly one line of the form

    MODEL = "path/to/your/model"   # your model: ...

(the marker is the comment "# your model"); tests put a stand-in there (an HF folder, a GGUF file, an
ONNX folder). A backend's quickstart is the one block that imports draftcore.adapters.<its adapter>
and has that line. Standard library only: the wheel test imports this module from a fresh venv.
"""
from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"

# backend name -> the adapter module its quickstart imports
BACKENDS = {"hf": "torch_hf", "llamacpp": "llamacpp", "onnx": "onnx"}

MODEL_MARK = "# your model"
_MODEL_LINE = re.compile(r'^(?P<head>\s*MODEL\s*=\s*)(?P<value>"[^"\n]*"|\'[^\'\n]*\')(?P<tail>\s*# your model\b.*)$',
                         re.MULTILINE)
_FENCE = re.compile(r"^```(?P<lang>[^\n`]*)\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*#*\s*$", re.MULTILINE)


def python_blocks(path=README) -> list:
    """Every ```python fence of the Markdown file at `path`, as (nearest heading above it, code)."""
    text = Path(path).read_text(encoding="utf-8")
    headings = [(m.start(), m.group("title")) for m in _HEADING.finditer(text)]
    blocks = []
    for fence in _FENCE.finditer(text):
        if fence.group("lang").strip().lower() not in ("python", "py", "python3"):
            continue
        # headings inside other fences (a bash comment) are not headings: keep only those outside every fence
        heading = ""
        for start, title in headings:
            if start > fence.start():
                break
            if not _inside_fence(text, start):
                heading = title
        blocks.append((heading, fence.group("body")))
    return blocks


def _inside_fence(text: str, pos: int) -> bool:
    return any(f.start() <= pos < f.end() for f in _FENCE.finditer(text))


def has_model_variable(code: str) -> bool:
    return len(_MODEL_LINE.findall(code)) == 1


def substitute_model(code: str, model) -> str:
    """`code` with its one marked `MODEL = "..."   # your model ...` line set to `model` (a str or a path)."""
    found = _MODEL_LINE.findall(code)
    if len(found) != 1:
        raise ValueError(f"expected exactly one line 'MODEL = \"...\"   {MODEL_MARK}...' in the block, found {len(found)}")
    return _MODEL_LINE.sub(lambda m: m.group("head") + repr(str(model)) + m.group("tail"), code)


def quickstart(backend: str, model, path=README) -> str:
    """The README's quickstart for `backend` ("hf", "llamacpp", "onnx"), with its model variable set to `model`."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {backend!r}")
    module = re.compile(rf"\bdraftcore\.adapters\.{BACKENDS[backend]}\b")
    matches = [code for _, code in python_blocks(path) if module.search(code) and has_model_variable(code)]
    if len(matches) != 1:
        raise ValueError(f"expected one README quickstart for {backend!r} (a python block importing "
                         f"draftcore.adapters.{BACKENDS[backend]} with a marked MODEL line), found {len(matches)}")
    return substitute_model(matches[0], model)
