"""Decoding traces: (prompt ids, plain greedy output ids) pairs, one JSON object per line.

    {"dataset": "humaneval", "idx": 0, "prompt_ids": [...], "output_ids": [...]}

Recorded from a real backend (`draftcore record`) or built from reference texts; replayed by
`draftcore replay` to compare drafters without running a model.
"""
from __future__ import annotations

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
    """Read and validate a JSONL trace file."""
    traces = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    except OSError as exc:
        raise InputError(f"path: cannot read trace file {str(path)!r}: {exc}") from exc
    for n, line in lines:
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
            traces.append(Trace(str(obj["dataset"]), int(obj["idx"]),
                                token_array(f"{where} prompt_ids", obj["prompt_ids"]),
                                token_array(f"{where} output_ids", obj["output_ids"])))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise InputError(f"path: line {where} is not a trace object with dataset, idx, prompt_ids, "
                             f"output_ids: {exc!r}") from exc
    if not traces:
        raise InputError(f"path: trace file {str(path)!r} holds no traces")
    return traces


def write_traces(path, traces) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for trace in traces:
            f.write(trace.to_json() + "\n")
