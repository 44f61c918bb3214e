"""benchmarks/gpu_check.py in its small mode (`make gpu-check DEVICE=cpu`): the GPU check's every
section runs here on the CPU through the code it runs on a GPU, so no later change can break the
prepared GPU run unseen. Also its verdict on outputs that differ (near-tie or BUG), and the
staging's refusal of a missing or corrupt part."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


gpu_check = _load("gpu_check")
gpu_stage = _load("gpu_stage")


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    stage = tmp_path_factory.mktemp("stage")
    data = gpu_check.main(["--device", "cpu", "--out", str(out), "--stage", str(stage), "--strict"])
    return data, out


def test_small_mode_runs_every_section_of_the_gpu_check(small_run):
    data, out = small_run
    sections = data["sections"]
    expected = ["env", "hf float32", "hf bfloat16", "onnx", "onnx chain", "llamacpp"]
    assert list(sections) == expected
    installed = {"onnx": importlib.util.find_spec("onnxruntime"), "llamacpp": importlib.util.find_spec("llama_cpp"),
                 "onnx chain": importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("onnxruntime_genai")}
    for name in expected[1:]:
        if name in installed and not installed[name]:
            assert "not installed" in sections[name]["skipped"]
            continue
        section = sections[name]
        assert "skipped" not in section, f"{name}: {section.get('skipped')}"
        methods = {r["method"] for r in section["rows"]}
        assert len(methods) >= 3 and {r["dataset"] for r in section["rows"]} == {"repeat", "random"}
        assert all(ms > 0 for ms in section["ms_by_nodes"].values()) and 1 in map(int, section["ms_by_nodes"])
    if installed["llamacpp"]:   # the long-context exactness probe, by cached tokens (tiny float32 GGUF here)
        probe = sections["llamacpp"]["chain_vs_one_token"]
        assert list(map(int, probe)) == list(gpu_check.LONG_CONTEXTS) and all(d >= 0 for d in probe.values())
        assert "a 4-token chain verified at once" in (out / "gpu_check.md").read_text()
    # the files the GPU run brings back: the JSON with its report, and the markdown table
    written = json.loads((out / "gpu_check.json").read_text())
    assert written["report"]["tables"] and (out / "gpu_check.md").read_text().count("| plain greedy") >= 4


def test_small_mode_outputs_equal_plain_decoding(small_run):
    """fp32 on the CPU: every method's greedy output is plain decoding's, on every backend; bf16
    may differ only at a near-tie of plain decoding."""
    sections = small_run[0]["sections"]
    for name in ("hf float32", "onnx", "onnx chain", "llamacpp"):
        if "skipped" in sections[name]:
            continue
        assert sections[name]["divergences"] == [], name
        assert all(r["identical"] == r["prompts"] for r in sections[name]["rows"]), name
    assert all(d["verdict"] == "near-tie" for d in sections["hf bfloat16"]["divergences"])


def _one_difference():
    """A prompt, plain's output [7, 8, 9] and trie's [7, 8, 3]: they first differ at token 2."""
    from draftcore.tools.bench import Prompt
    prompt = Prompt("humaneval", 3, np.arange(5, dtype=np.int32))
    records = [{"dataset": "humaneval", "idx": 3, "method": "trie", "identical": False, "first_difference": 2},
               {"dataset": "humaneval", "idx": 3, "method": "plain", "identical": True, "first_difference": -1}]
    outputs = {("plain", prompt.ids.tobytes()): (prompt.ids, np.array([7, 8, 9], np.int32)),
               ("trie", prompt.ids.tobytes()): (prompt.ids, np.array([7, 8, 3], np.int32))}
    return prompt, records, outputs


def _logits(row, seen):
    """Plain decoding's logits after any ids: `row` (vocab 12), the ids kept in `seen`."""
    def logits_after(ids):
        seen.append(ids.tolist())
        return np.asarray(row, np.float32)
    return logits_after


def test_a_difference_is_a_near_tie_only_within_the_bound():
    """The verdict the GPU run reports: plain decoding's logit gap between its top-1 token (9) and
    the other output's token (3) where they first differ, a near-tie within the bound, else BUG."""
    prompt, records, outputs = _one_difference()
    seen, row = [], np.zeros(12)
    row[9], row[3] = 4.0, 3.99
    tie = gpu_check._divergences(records, outputs, [prompt], "plain", _logits(row, seen), bound=0.5)
    assert tie == [{"dataset": "humaneval", "idx": 3, "method": "trie", "position": 2, "plain_token": 9,
                    "other_token": 3, "gap": pytest.approx(0.01, abs=1e-5), "verdict": "near-tie"}]
    assert seen[-1] == [0, 1, 2, 3, 4, 7, 8]   # the prompt, then plain's output up to the difference


def test_a_planted_large_gap_is_called_a_bug_even_where_the_top_two_are_close():
    """Plain's top two (9 and 5) are 0.01 apart, but the other output chose token 3, planted 6 below
    the top: the old top-2 gap called that a near-tie; the competing tokens' gap calls it a BUG, in
    the section's table and in its line of words."""
    prompt, records, outputs = _one_difference()
    row = np.zeros(12)
    row[9], row[5], row[3] = 4.0, 3.99, -2.0
    found = gpu_check._divergences(records, outputs, [prompt], "plain", _logits(row, []), bound=0.5)
    assert found[0]["verdict"] == "BUG" and found[0]["gap"] == pytest.approx(6.0)
    table = gpu_check.section_tables("onnx", {"divergences": found})[-1]
    assert table["rows"] == [["trie", "humaneval 3", "2", "9 / 3", "6", "BUG"]]
    assert "gap 6: BUG" in gpu_check._divergence_line(found)


def test_an_output_that_ends_where_plain_goes_on_is_a_bug():
    """No competing token to weigh (trie stopped at token 2, plain did not): unexplained, a BUG."""
    prompt, records, outputs = _one_difference()
    outputs[("trie", prompt.ids.tobytes())] = (prompt.ids, np.array([7, 8], np.int32))
    found = gpu_check._divergences(records, outputs, [prompt], "plain", _logits(np.zeros(12), []), bound=0.5)
    assert found[0]["position"] == 2 and found[0]["verdict"] == "BUG" and found[0]["other_token"] is None


def test_runs_recorded_before_the_gap_render_as_they_were_measured():
    """docs/results' older runs: a top-2 gap with its verdict, or no gap at all (unexplained: BUG)."""
    old = [{"dataset": "mtbench", "idx": 5, "method": "trie", "position": 107},
           {"dataset": "mtbench", "idx": 9, "method": "trie", "position": 52, "top2_gap": 0.25, "near_tie": True}]
    rows = gpu_check.section_tables("onnx", {"divergences": old})[-1]["rows"]
    assert rows == [["trie", "mtbench 5", "107", "-", "-", "BUG (no gap measured)"],
                    ["trie", "mtbench 9", "52", "-", "0.25 (top-2)", "near-tie"]]


def test_staged_parts_are_joined_only_when_complete_and_intact(tmp_path):
    data = bytes(range(256)) * 10
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    manifest = {"files": [{"name": "m.gguf", "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                           "chunks": [["a", "m.gguf.0"], ["b", "m.gguf.1"]]}]}
    (tmp_path / "a" / gpu_stage.MANIFEST).write_text(json.dumps(manifest))
    (tmp_path / "a" / "m.gguf.0").write_bytes(data[:1000])
    path, why = gpu_stage.assemble(tmp_path, "m.gguf")
    assert path is None and "parts ['b'] not sent yet" in why
    (tmp_path / "b" / "m.gguf.1").write_bytes(data[1000:-1] + b"x")
    path, why = gpu_stage.assemble(tmp_path, "m.gguf")
    assert path is None and "corrupt" in why
    (tmp_path / "b" / "m.gguf.1").write_bytes(data[1000:])
    path, why = gpu_stage.assemble(tmp_path, "m.gguf")
    assert why == "" and path.read_bytes() == data
    assert gpu_stage.assemble(tmp_path, "other.whl")[0] is None


def test_plain_logits_are_read_through_a_verifier():
    """ONNX's and llama.cpp's near-tie verdict: the logits after the ids, from one prefill."""
    calls = []

    class Verifier:
        def prefill(self, ids, n_logits):
            calls.append((ids.dtype, ids.tolist(), n_logits))
            return np.array([2], np.int32), np.array([[0.5, 3.0, -1.0, 2.75]], np.float32)

    assert gpu_check._logits_through(Verifier())(np.array([4, 5], np.int64)).tolist() == [0.5, 3.0, -1.0, 2.75]
    assert calls == [(np.int32, [4, 5], 1)]


def test_only_a_llama_cpp_python_wheel_is_staged_as_one(tmp_path):
    from draftcore.errors import ConfigError
    wheel = tmp_path / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    wheel.write_bytes(b"PK")
    assert gpu_stage.checked_llama_cpp_wheel(str(wheel)) == wheel
    for bad in (tmp_path / "missing.whl", tmp_path / "llama_cpp_python-0.3.36.tar.gz", tmp_path):
        if bad.suffix == ".gz":
            bad.write_bytes(b"")
        with pytest.raises(ConfigError, match="--llama-cpp-wheel: expected a llama_cpp_python-"):
            gpu_stage.checked_llama_cpp_wheel(bad)
