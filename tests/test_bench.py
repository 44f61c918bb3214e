"""The benchmark harness and the CLI commands around it."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from draftcore import cli
from draftcore.bench import Method, Prompt, Run, format_table, run_benchmark, summarize, write_outputs
from draftcore.traces import read_traces


def _fake_method(name, seconds_per_token, corrupt_at=None):
    def run(prompt_ids, max_new_tokens):
        tokens = (np.arange(max_new_tokens) + int(prompt_ids[0])).astype(np.int32)
        if corrupt_at is not None:
            tokens[corrupt_at] += 1
        return Run(tokens, seconds_per_token * max_new_tokens, max_new_tokens // 2 or 1)
    return Method(name, run)


def test_run_benchmark_interleaves_checks_identity_and_summarizes(tmp_path):
    calls = []
    plain = _fake_method("plain", 0.02)
    fast = _fake_method("fast", 0.01)
    wrong = _fake_method("wrong", 0.01, corrupt_at=3)
    for m in (plain, fast, wrong):
        inner = m.run
        m.run = (lambda inner, name: lambda p, n: (calls.append(name), inner(p, n))[1])(inner, m.name)
    prompts = [Prompt("d", i, np.array([i + 1], np.int32)) for i in range(4)]
    records = run_benchmark([plain, fast, wrong], prompts, 8, warmup=1)
    assert calls[:3] == ["plain", "fast", "wrong"]  # interleaved prompt by prompt
    assert len(records) == 3 * 3  # the warm-up prompt is run but not recorded
    rows = {r["method"]: r for r in summarize(records, baseline="plain")}
    assert rows["fast"]["speedup"] == pytest.approx(2.0)
    assert rows["fast"]["identical"] == 3 and rows["wrong"]["identical"] == 0
    assert all(r["first_difference"] == 3 for r in records if r["method"] == "wrong")
    assert "| d | fast | 3 |" in format_table(list(rows.values()))
    paths = write_outputs(str(tmp_path / "b"), {"title": "t"}, records, list(rows.values()))
    assert json.load(open(paths[0]))["summary"]
    if len(paths) > 1:
        assert os.path.getsize(paths[1]) > 1000  # a real PNG


def test_replay_cli_on_shared_traces(capsys):
    path = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "traces_smollm2_greedy.jsonl")
    if not os.path.exists(path):
        pytest.skip("../shared/data is not beside this checkout")
    assert cli.main(["replay", "--traces", path, "--eos", "2", "--decoding-length", "16"]) == 0
    out = capsys.readouterr().out
    assert "humaneval" in out and "mtbench" in out


def test_cli_reports_bad_input_as_an_error(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"dataset": "x"}\n')
    assert cli.main(["replay", "--traces", str(bad)]) == 2
    assert "not a trace object" in capsys.readouterr().err


def test_record_then_replay_on_smollm2(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from draftcore.adapters.torch_hf.smollm2 import packaged_gguf
    try:
        packaged_gguf()
    except Exception as exc:
        pytest.skip(f"optional backend data missing: {exc}")
    out = tmp_path / "t.jsonl"
    assert cli.main(["record", "--dataset", "humaneval", "--n", "2", "--max-new-tokens", "12",
                     "--out", str(out)]) == 0
    traces = read_traces(out)
    assert len(traces) == 2 and all(t.output_ids.shape[0] == 12 for t in traces)
    assert cli.main(["replay", "--traces", str(out)]) == 0
