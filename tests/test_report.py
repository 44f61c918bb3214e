"""The one table writer, the report every benchmark's JSON carries, and `draftcore results`, which
renders docs/results.md and the README's results block from those reports (which run goes on which page,
and the result files' names: test_results.py)."""
from __future__ import annotations

import json

import pytest

from draftcore.errors import DraftcoreError, InputError
from draftcore.tools import backends, cli
from draftcore.tools.report import command_line, machine, machine_line, make_report, markdown_table, table
from draftcore.tools.results import refresh_readme, render_pages


def test_markdown_table_writes_a_header_a_rule_and_one_row_per_item():
    text = markdown_table(["a", "b|c"], [[1, "x"], [2.5, "two\nlines"]])
    assert text == ("| a | b\\|c |\n"
                    "|---|---|\n"
                    "| 1 | x |\n"
                    "| 2.5 | two lines |")          # a "|" or a newline in a cell would break the table
    assert markdown_table(["only"], []) == "| only |\n|---|"
    with pytest.raises(InputError, match=r"rows\[1\]: expected 2 cells"):
        markdown_table(["a", "b"], [[1, 2], [3]])


def test_a_report_records_the_command_the_machine_and_the_tables_as_printed():
    kept = table("t", ["n", "ms"], [[1, 2.50]])
    assert kept == {"title": "t", "header": ["n", "ms"], "rows": [["1", "2.5"]]}
    report = make_report("title", [kept], command="python benchmarks/x.py --n 2", settings={"threads": 2})
    assert set(report) == {"title", "command", "date", "machine", "tables"}
    found = report["machine"]
    assert found["logical_cores"] >= 1 and found["cpu"] and found["python"]
    assert {"numpy", "numba"} <= set(found["versions"]) and found["settings"] == {"threads": 2}
    assert "numpy" in machine_line(found) and "threads=2" in machine_line(found)
    assert json.loads(json.dumps(report)) == report                       # it goes into a JSON as it is
    assert machine()["versions"].keys() >= {"numpy", "numba"}


def test_the_machine_names_its_widest_vector_instructions(tmp_path):
    """A verify's cost shape follows them (AVX-512 against AVX2), so every table's machine line says."""
    from draftcore.tools.report import cpu_model, cpuinfo_fields, vector_isa
    for flags, want in (("fpu avx avx2 avx512f avx512bw", "AVX-512"), ("fpu sse4_2 avx avx2 fma", "AVX2"),
                        ("fp asimd evtstrm", "NEON"), ("fpu sse2", None)):
        cpuinfo = tmp_path / "cpuinfo"
        key = "Features" if "asimd" in flags else "flags"
        cpuinfo.write_text(f"processor\t: 0\nmodel name\t: Some CPU\n{key}\t\t: {flags}\nprocessor\t: 1\n")
        fields = cpuinfo_fields(str(cpuinfo))
        assert vector_isa(fields) == want and cpu_model(fields) == "Some CPU"
        line = machine_line({"cpu": "Some CPU", "vector_isa": want, "logical_cores": 2})
        assert line.startswith(f"Some CPU ({want}), 2 logical cores" if want else "Some CPU, 2 logical cores")
    # and which of them torch's kernels use, where a run capped them (ATEN_CPU_CAPABILITY=avx2)
    line = machine_line({"cpu": "Some CPU", "vector_isa": "AVX-512", "logical_cores": 2, "versions": {"torch": "2.13"},
                         "threads": {"torch": 2}, "kernel_isa": {"torch": "AVX2"}})
    assert "torch 2.13 (2 threads, AVX2 kernels)" in line
    assert cpuinfo_fields(str(tmp_path / "missing")) == {}


def test_the_command_line_is_what_one_types_again():
    assert command_line(["draftcore", "bench", "--n", "2"]) == "draftcore bench --n 2"
    assert command_line(["/somewhere/bin/draftcore", "results"]) == "draftcore results"
    # draftcore's options in the environment are part of the command (the cache folder is not)
    assert command_line(["draftcore", "bench"], {"DRAFTCORE_PAUSE": "off", "DRAFTCORE_CACHE": "/c", "HOME": "/h",
                                                 "DRAFTCORE_LLAMACPP_KV": "q8_0"}) == \
        "DRAFTCORE_LLAMACPP_KV=q8_0 DRAFTCORE_PAUSE=off draftcore bench"
    # so are the variables that cap the kernels' instruction set (an AVX-512 CPU running AVX2's)
    assert command_line(["draftcore", "bench"], {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                                                 "PATH": "/bin"}) == \
        "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 draftcore bench"
    script = command_line(["benchmarks/trie_memory.py", "--tokens", "10 000"])
    assert script.endswith(" benchmarks/trie_memory.py --tokens '10 000'")


def _fake_bench(tmp_path, monkeypatch, capsys):
    """A tiny `draftcore bench` run on the toy backend: (its JSON's path, what it printed)."""
    monkeypatch.setattr(backends, "_registered", {})
    backends.register_backend("toy", "fake_backend")
    argv = ["bench", "--backend", "toy", "--datasets", "d", "--n", "2", "--warmup", "0", "--max-new-tokens", "6",
            "--methods", "nodraft,trie", "--out", str(tmp_path / "toy")]
    assert cli.main(argv) == 0
    return tmp_path / "toy.json", capsys.readouterr().out


def test_a_bench_run_round_trips_into_the_results_page(tmp_path, monkeypatch, capsys):
    path, printed = _fake_bench(tmp_path, monkeypatch, capsys)
    report = json.loads(path.read_text())["report"]
    assert report["command"] == ("draftcore bench --backend toy --datasets d --n 2 --warmup 0 --max-new-tokens 6 "
                                 f"--methods nodraft,trie --out {tmp_path / 'toy'}")
    assert report["machine"]["settings"] == {"attn": "toy-attention"}    # the backend's model_settings hook
    shown = markdown_table(report["tables"][0]["header"], report["tables"][0]["rows"])
    assert shown in printed and "| d | trie | 2 |" in shown                # the table as printed
    assert f"machine: {machine_line(report['machine'])}" in printed         # one line under the table

    page, readme = tmp_path / "results.md", tmp_path / "README.md"
    readme.write_text("# A README without a results block\n")
    assert cli.main(["results", str(path), "--out", str(page), "--readme", str(readme)]) == 0
    text = page.read_text()
    assert "generated by `draftcore results`" in text and "do not edit it by hand" in text
    for part in (f"**{report['title']}**", f"`{report['command']}`", report["date"],
                 machine_line(report["machine"]), shown, "(toy.json)"):
        assert part in text, part
    assert readme.read_text() == "# A README without a results block\n"  # no marker: nothing to do


def test_the_readme_refresh_rewrites_only_its_block(tmp_path, monkeypatch, capsys):
    path, _ = _fake_bench(tmp_path, monkeypatch, capsys)
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "toy.json").write_text(path.read_text())
    before = "# Title\n\nSome text | with a pipe.\n\n<!-- results:begin docs/results/toy.json table=0 -->\n"
    after = "<!-- results:end -->\n\n## Next\nmore text\n"
    readme = tmp_path / "README.md"
    readme.write_text(before + "| stale | table |\n|---|---|\n" + after)
    page = tmp_path / "docs" / "results.md"

    monkeypatch.chdir(tmp_path)
    assert cli.main(["results", "--out", str(page), "--readme", str(readme)]) == 0   # docs/results/*.json
    text = readme.read_text()
    assert text.startswith(before) and text.endswith(after) and "stale" not in text
    report = json.loads(path.read_text())["report"]
    block = text[len(before):-len(after)]
    assert markdown_table(report["tables"][0]["header"], report["tables"][0]["rows"]) in block
    assert f"`{report['command']}`" in block and report["date"] in block
    assert "[docs/results.md](docs/results.md)" in block
    assert len(block.strip().split("\n\n")[0].splitlines()) == 1            # a one-line caption
    assert refresh_readme(text, str(readme), str(page)) == text             # rerunning changes nothing
    assert f"**{report['title']}**" in page.read_text()


@pytest.mark.parametrize("readme, words", [
    ("<!-- results:begin docs/results/toy.json table=0 -->\nno end\n", ["line 1", "results:end"]),
    ("<!-- results:begin docs/results/toy.json table=5 -->\n<!-- results:end -->\n", ["table=5", "1 table(s)"]),
    ("<!-- results:begin docs/results/none.json table=0 -->\n<!-- results:end -->\n", ["none.json"]),
])
def test_a_broken_results_block_is_refused_naming_it(tmp_path, readme, words):
    (tmp_path / "docs" / "results").mkdir(parents=True)
    report = make_report("t", [table("", ["a"], [[1]])], command="draftcore bench")
    (tmp_path / "docs" / "results" / "toy.json").write_text(json.dumps({"report": report}))
    with pytest.raises(InputError) as caught:
        refresh_readme(readme, str(tmp_path / "README.md"), str(tmp_path / "docs" / "results.md"))
    for word in words:
        assert word in str(caught.value)


def test_a_json_without_a_report_is_refused_naming_the_file(tmp_path, capsys):
    old = tmp_path / "old_run.json"
    old.write_text(json.dumps({"config": {}, "summary": []}))
    with pytest.raises(DraftcoreError, match="old_run.json holds no 'report' object"):
        render_pages([str(old)], str(tmp_path / "results.md"))
    page = tmp_path / "results.md"
    assert cli.main(["results", str(old), "--out", str(page), "--readme", str(tmp_path / "README.md")]) == 2
    assert "old_run.json" in capsys.readouterr().err and not page.exists()  # nothing written
    assert not (tmp_path / "results-archive.md").exists()
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"report": {"title": "t"}}))
    with pytest.raises(InputError, match="broken.json's report lacks"):
        render_pages([str(broken)], str(page))
