"""`draftcore results`: what a run measured (its report alone says), the newest run of each measurement on
docs/results.md and every other on the archive, the result files' names, and the committed pages."""
from __future__ import annotations

import glob
import json
import os

import pytest

from draftcore.tools import cli
from draftcore.tools.report import table
from draftcore.tools.results import (archive_path, backend_of, benchmark_of, conditions_of, default_inputs,
                                     load_report, load_runs, machine_kind, measurement, name_problem, newest_runs,
                                     render_pages, result_name, subject_of)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
AVX512 = {"cpu": "AMD EPYC", "vector_isa": "AVX-512", "logical_cores": 2}


def _report(command: str, date: str = "2026-12-04 22:58 +0000", machine: dict | None = None, **extra) -> dict:
    return {"title": "t", "command": command, "date": date, "machine": dict(machine or AVX512),
            "tables": [table("", ["a"], [[1]])], **extra}


def _write(folder, name: str, report: dict) -> str:
    path = folder / name
    path.write_text(json.dumps({"report": report}))
    return str(path)


@pytest.mark.parametrize("machine, kind", [
    ({"gpu": "NVIDIA H200", "cpu": "Intel(R) Xeon(R) Processor"}, "h200"),   # a run on the GPU: the GPU's kind
    ({"gpu": "NVIDIA H100 80GB HBM3", "vector_isa": "AVX-512"}, "h100"),
    ({"gpu": "NVIDIA GeForce RTX 4090"}, "geforce-rtx-4090"),
    ({"vector_isa": "AVX-512"}, "cpu-avx512"),
    ({"vector_isa": "AVX2"}, "cpu-avx2"),
    ({"vector_isa": "NEON"}, "cpu-neon"),
    ({"cpu": "AMD EPYC"}, "cpu"),                     # a report from before the instruction set was recorded
])
def test_the_machine_kind_is_the_gpu_else_the_cpus_vector_instructions(machine, kind):
    assert machine_kind(machine) == kind


def test_what_a_run_measured_is_read_from_its_command():
    bench = _report("draftcore bench --backend hf --datasets edit,agent --n 10 --warmup 5 --methods plain,trie "
                    "--control --out bench_out/s83/x")
    assert (benchmark_of(bench), backend_of(bench), subject_of(bench), conditions_of(bench)) == \
        ("bench", "hf", ("agent-edit",), ())
    # how many prompts, the methods beside each other and where the output went are no part of it
    again = _report("draftcore bench --backend hf --datasets agent,edit --n 15 --methods plain,nodraft --out y")
    assert measurement(again) == measurement(bench)
    # a script run through an environment's python, its backends by default, a make target's command
    floor = _report(".venv/bin/python benchmarks/floor.py --rounds 3 --out bench_out/s60/floor")
    assert (benchmark_of(floor), backend_of(floor)) == ("floor", "hf-llamacpp-onnx")
    gpu = _report("make gpu-check  (benchmarks/gpu_check.py --device cuda --model smollm2 --sections onnx)",
                  machine={"gpu": "NVIDIA H200"})
    assert (benchmark_of(gpu), backend_of(gpu), machine_kind(gpu["machine"]), subject_of(gpu)) == \
        ("gpu-check", "onnx", "h200", ("smollm2",))
    replay = _report(".venv-vllm/bin/python benchmarks/chain_replay.py --token-cost 0.14 "
                     "--traces benchmarks/data/smollm2_workload_traces.jsonl.gz")
    assert (backend_of(replay), subject_of(replay)) == ("none", ("token-cost-0.14", "smollm2-workload"))
    # serving's --server names the server, filed under the backend it runs (llama.cpp by default)
    for server, backend in (("", "llamacpp"), (" --server llamacpp", "llamacpp"), (" --server transformers", "hf")):
        served = _report(f".venv/bin/python benchmarks/serving.py{server} --n 20 --datasets edit,mtbench")
        assert (benchmark_of(served), backend_of(served), subject_of(served)) == ("serving", backend, ("edit-mtbench",))
    # a mode that measures something else is another benchmark
    plans = _report(".venv/bin/python benchmarks/prefill_reuse.py --splits 35/250,109/224")
    assert (benchmark_of(plans), backend_of(plans), subject_of(plans)) == ("prefill-plans", "hf", ())


def test_conditions_outside_the_options_make_another_measurement():
    plain = _report("draftcore bench --backend hf --datasets edit")
    capped = _report("ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 "
                     "draftcore bench --backend hf --datasets edit")
    assert conditions_of(capped) == ("avx2-kernels",) and measurement(capped) != measurement(plain)
    costs = _report("DRAFTCORE_MATCH_COST=inf DRAFTCORE_TOKEN_COST=0 python benchmarks/vllm_proposer.py --batch 8")
    assert conditions_of(costs) == ("match-cost-inf", "token-cost-0")
    # llama.cpp's KV cache type: named by the command now, only in the settings in older reports
    named = _report("DRAFTCORE_LLAMACPP_KV=q8_0 python benchmarks/floor.py --backends llamacpp")
    recorded = _report("python benchmarks/floor.py --backends llamacpp",
                       machine=dict(AVX512, settings={"kernels": json.dumps({"llamacpp": {"kv_cache": "q8_0"}})}))
    default = _report("python benchmarks/floor.py --backends llamacpp",
                      machine=dict(AVX512, settings={"kv_cache": "f16"}))
    assert conditions_of(named) == conditions_of(recorded) == ("llamacpp-kv-q8-0",)
    assert measurement(named) == measurement(recorded) and conditions_of(default) == ()


def test_the_page_shows_the_newest_run_of_each_measurement_and_the_archive_every_other(tmp_path):
    command = "draftcore bench --backend hf --datasets agent --n 10"
    paths = {
        "old": _write(tmp_path, "bench_hf_cpu-avx512_2026-12-01.json", _report(command, "2026-12-01 20:28 +0000")),
        "newest": _write(tmp_path, "bench_hf_cpu-avx512_2026-12-04.json", _report(command, "2026-12-04 22:58 +0000")),
        # measured later, but on code a change replaced: never the current figure
        "before": _write(tmp_path, "bench_hf_cpu-avx512_2026-12-05.json",
                         _report(command, "2026-12-05 01:00 +0000", predates="the prefill plans")),
        "avx2": _write(tmp_path, "bench_hf_cpu-avx2_2026-11-29.json",
                       _report(command, "2026-11-29 11:53 +0000", dict(AVX512, vector_isa="AVX2"))),
    }
    current, older = newest_runs(load_runs(list(paths.values())))
    assert sorted(run.path for run in current) == sorted([paths["newest"], paths["avx2"]])
    assert [run.path for run in older] == [paths["before"], paths["old"]]      # newest first

    page, archive = render_pages(list(paths.values()), str(tmp_path / "results.md"))
    for key, path in paths.items():
        on_page, in_archive = os.path.basename(path) in page, os.path.basename(path) in archive
        assert (on_page, in_archive) == ((True, False) if key in ("newest", "avx2") else (False, True)), key
    assert "generated by `draftcore results`" in page and "generated by `draftcore results`" in archive
    assert "[results-archive.md](results-archive.md)" in page and "[results.md](results.md)" in archive
    assert "| bench | hf | cpu-avx512 | agent | [2026-12-04](#bench-hf-cpu-avx512-agent) |" in page  # the index
    assert "[2 in the archive](results-archive.md#bench-hf-cpu-avx512-agent)" in page
    assert "- predates: the prefill plans" in archive
    assert archive_path(str(tmp_path / "results.md")) == str(tmp_path / "results-archive.md")


def test_a_runs_ties_go_to_the_later_name(tmp_path):
    command = "draftcore bench --backend hf --datasets agent"
    first = _write(tmp_path, "bench_hf_cpu-avx512_2026-12-04_a.json", _report(command))
    second = _write(tmp_path, "bench_hf_cpu-avx512_2026-12-04_b.json", _report(command))
    current, older = newest_runs(load_runs([first, second]))
    assert [run.path for run in current] == [second] and [run.path for run in older] == [first]


def test_a_result_is_named_for_what_it_measured():
    report = _report("draftcore bench --backend hf --datasets agent", "2026-12-04 22:58 +0000")
    assert result_name(report) == "bench_hf_cpu-avx512_2026-12-04.json"
    assert result_name(report, "agent") == "bench_hf_cpu-avx512_2026-12-04_agent.json"
    alone = ["bench_hf_cpu-avx512_2026-12-04.json"]
    assert name_problem("bench_hf_cpu-avx512_2026-12-04.json", report, alone) is None
    shared = ["bench_hf_cpu-avx512_2026-12-04_agent.json", "bench_hf_cpu-avx512_2026-12-04_edit.json"]
    assert name_problem("bench_hf_cpu-avx512_2026-12-04_agent.json", report, shared) is None
    capped = _report("ATEN_CPU_CAPABILITY=avx2 draftcore bench --backend hf", "2026-12-05 01:59 +0000")
    assert name_problem("bench_hf_cpu-avx512_2026-12-05_avx2-kernels.json", capped, []) is None


@pytest.mark.parametrize("name, others, words", [
    ("workloads_hf_cpu_avx512_fifth.json", [], ["expected bench_hf_cpu-avx512_2026-12-04.json"]),
    ("bench_hf_cpu-avx512_2026-12-03.json", [], ["expected bench_hf_cpu-avx512_2026-12-04.json"]),  # its date
    ("bench_onnx_cpu-avx512_2026-12-04.json", [], ["backend, machine kind, date"]),
    ("bench_hf_cpu-avx2_2026-12-04.json", [], ["expected bench_hf_cpu-avx512_2026-12-04"]),
    ("bench_hf_cpu-avx512_2026-12-04_fifth.json", ["bench_hf_cpu-avx512_2026-12-04_edit.json"], ["counts runs"]),
    ("bench_hf_cpu-avx512_2026-12-04_agent-second.json", ["bench_hf_cpu-avx512_2026-12-04.json"], ["counts runs"]),
    ("bench_hf_cpu-avx512_2026-12-04_Agent.json", ["bench_hf_cpu-avx512_2026-12-04.json"], ["lowercase words"]),
    ("bench_hf_cpu-avx512_2026-12-04_agent.json", [], ["needs no slug"]),
    ("bench_hf_cpu-avx512_2026-12-04.json", ["bench_hf_cpu-avx512_2026-12-04_edit.json"], ["shares that name"]),
])
def test_a_name_that_counts_runs_or_differs_from_its_report_is_refused(name, others, words):
    report = _report("draftcore bench --backend hf --datasets agent", "2026-12-04 22:58 +0000")
    problem = name_problem(name, report, [name, *others])
    assert problem is not None and all(word in problem for word in words), problem


def test_a_run_under_a_condition_says_so_in_its_name():
    capped = _report("ATEN_CPU_CAPABILITY=avx2 draftcore bench --backend hf", "2026-12-05 01:59 +0000")
    assert "ran under avx2-kernels" in name_problem("bench_hf_cpu-avx512_2026-12-05.json", capped, [])


def test_every_committed_result_is_named_for_what_it_measured():
    paths = sorted(glob.glob(os.path.join(ROOT, "docs", "results", "*.json")))
    assert paths, "no docs/results/*.json found"
    problems = [name_problem(path, load_report(path), paths) for path in paths]
    assert [problem for problem in problems if problem] == []


def test_the_committed_pages_are_what_draftcore_results_writes(monkeypatch):
    """docs/results.md and its archive are generated: rerun `draftcore results` after changing docs/results/."""
    monkeypatch.chdir(ROOT)
    page, archive = render_pages(default_inputs(), os.path.join("docs", "results.md"))
    with open(os.path.join("docs", "results.md")) as f:
        assert f.read() == page, "docs/results.md is stale: run `draftcore results`"
    with open(os.path.join("docs", "results-archive.md")) as f:
        assert f.read() == archive, "docs/results-archive.md is stale: run `draftcore results`"


def test_draftcore_results_writes_both_pages_and_prints_names(tmp_path, capsys):
    path = _write(tmp_path, "run.json", _report("draftcore bench --backend hf --datasets agent"))
    page = tmp_path / "out" / "results.md"
    page.parent.mkdir()
    assert cli.main(["results", path, "--out", str(page), "--readme", str(tmp_path / "none.md")]) == 2  # no README
    assert not page.exists()
    (tmp_path / "README.md").write_text("# no results block\n")
    assert cli.main(["results", path, "--out", str(page), "--readme", str(tmp_path / "README.md")]) == 0
    assert page.exists() and (tmp_path / "out" / "results-archive.md").exists()
    capsys.readouterr()
    assert cli.main(["results", "--name", path]) == 0
    assert capsys.readouterr().out == f"{path}: bench_hf_cpu-avx512_2026-12-04.json\n"
