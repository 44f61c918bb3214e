"""Decoding traces: (prompt ids, plain greedy output ids) pairs, one JSON object per line.

    {"dataset": "humaneval", "idx": 0, "prompt_ids": [...], "output_ids": [...]}

Recorded from a real backend (`draftcore record`) or built from reference texts; replayed by
`draftcore replay` to compare drafters and budgets without running a model. A path ending in
".gz" is read and written gzip-compressed (the repo's traces are stored that way).
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..validate import token_array


@dataclass(frozen=True)
class Trace:
    dataset: str
    idx: int
    prompt_ids: np.ndarray  # int32[T]
    output_ids: np.ndarray  # int32[k], k >= 1

    def to_json(self) -> str:
        return json.dumps({"dataset": self.dataset, "idx": self.idx,
                           "prompt_ids": self.prompt_ids.tolist(), "output_ids": self.output_ids.tolist()})


def read_traces(path) -> list[Trace]:
    """Read and validate a JSONL trace file (gzip-compressed when the name ends in .gz)."""
    try:
        with _open_text(path) as f:
            lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise InputError(f"path: cannot read trace file {str(path)!r}: {exc}") from exc
    traces = [_parse_trace(line, f"{path}:{n}") for n, line in lines]
    if not traces:
        raise InputError(f"path: trace file {str(path)!r} holds no traces")
    return traces


def write_traces(path, traces) -> None:
    """Write `traces` as JSONL; gzip-compressed when `path` ends in .gz (no time stamp in the
    header: the same traces give the same bytes)."""
    text = "".join(trace.to_json() + "\n" for trace in traces)
    if str(path).endswith(".gz"):
        with open(path, "wb") as f:
            f.write(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def _parse_trace(line: str, where: str) -> Trace:
    try:
        obj = json.loads(line)
        return Trace(str(obj["dataset"]), int(obj["idx"]),
                     token_array(f"{where} prompt_ids", obj["prompt_ids"]),
                     token_array(f"{where} output_ids", obj["output_ids"]))
    except InputError:
        raise
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError) as exc:   # "idx": "abc", NaN
        raise InputError(f"path: line {where} is not a trace object with dataset, idx, prompt_ids, "
                         f"output_ids: {exc!r}") from exc


def _open_text(path):
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")
