"""benchmarks/gpu_check.py in its small mode (`make gpu-check DEVICE=cpu`): the GPU check's every
section runs here on the CPU through the code it runs on a GPU, so no later change can break the
prepared GPU run unseen. Also its verdict on outputs that differ (near-tie or mismatch), and the
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
    assert all(d["near_tie"] for d in sections["hf bfloat16"]["divergences"])


def test_a_difference_is_a_near_tie_only_within_the_bound():
    """The verdict the GPU run reports: the same difference is a near-tie when plain decoding's top-2
    gap there is within the bound, and a mismatch when it is wider."""
    from draftcore.tools.bench import Prompt
    prompt = Prompt("humaneval", 3, np.arange(5, dtype=np.int32))
    records = [{"dataset": "humaneval", "idx": 3, "method": "trie", "identical": False, "first_difference": 2},
               {"dataset": "humaneval", "idx": 3, "method": "plain", "identical": True, "first_difference": -1}]
    outputs = {("plain", prompt.ids.tobytes()): (prompt.ids, np.array([7, 8, 9], np.int32))}
    seen = []

    def gap(value):
        def top2_gap(ids):
            seen.append(ids.tolist())
            return value
        return top2_gap

    tie = gpu_check._divergences(records, outputs, [prompt], "plain", gap(0.01), bound=0.5)
    assert tie == [{"dataset": "humaneval", "idx": 3, "method": "trie", "position": 2, "top2_gap": 0.01,
                    "near_tie": True}]
    assert seen[-1] == [0, 1, 2, 3, 4, 7, 8]   # the prompt, then plain's output up to the difference
    mismatch = gpu_check._divergences(records, outputs, [prompt], "plain", gap(2.0), bound=0.5)
    assert mismatch[0]["near_tie"] is False
    assert "MISMATCH" in gpu_check._divergence_line(mismatch)


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


def test_the_top2_gap_is_read_through_a_verifier():
    """ONNX's and llama.cpp's near-tie verdict: the gap between the two largest logits after the ids, from one prefill."""
    calls = []

    class Verifier:
        def prefill(self, ids, n_logits):
            calls.append((ids.dtype, ids.tolist(), n_logits))
            return np.array([2], np.int32), np.array([[0.5, 3.0, -1.0, 2.75]], np.float32)

    assert gpu_check._top2_gap_through(Verifier())(np.array([4, 5], np.int64)) == 0.25
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
