"""`draftcore bench --backend onnx` hooks on the tiny Llama: both ONNX builds made offline and cached,
every method's output equal to plain greedy, unknown methods refused by name."""
import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install 'draftcore[onnx]')")
pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (draftcore[onnx-genai])")
pytest.importorskip("transformers")

from draftcore.errors import ConfigError  # noqa: E402
from draftcore.tools.backends import load_backend  # noqa: E402
from draftcore.tools.bench import Prompt, run_benchmark  # noqa: E402

from onnx_fixtures import save_tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    save_tiny_llama(folder, seed=0, vocab_size=512)
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DRAFTCORE_CACHE", str(cache))
        backend = load_backend("onnx")
        models, tokenizer = backend.load_model(str(folder))
        again, _ = backend.load_model(str(folder))   # cached: the same folders, nothing rebuilt
    assert (again.tree_dir, again.genai_dir) == (models.tree_dir, models.genai_dir)
    return backend, models, tokenizer


def test_every_method_equals_plain_greedy(loaded):
    backend, models, tokenizer = loaded
    names = ["plain", "plain_chain", "genai", "genai_ngram", "nodraft", "trie", "composite", "chain_trie",
             "plain_gqa", "gqa_trie", "gqa_nodraft", "composite-fixed4"]
    methods = backend.make_methods(models, tokenizer, names, eos_token_id=[1])
    prompts = [Prompt("tiny", i, np.asarray(p, np.int32))
               for i, p in enumerate([[0, 300, 301, 302, 300, 301, 302], [0] + list(range(400, 420))])]
    records = run_benchmark(methods, prompts, 24, warmup=0)
    for record in records:
        assert record["identical"], record["method"]
    want = backend.plain_greedy(models, tokenizer, prompts[0].ids, 24, eos_token_id=[1])
    assert len(want) > 0


def test_unknown_methods_are_refused_by_name(loaded):
    backend, models, tokenizer = loaded
    with pytest.raises(ConfigError, match="chain_tri"):
        backend.make_methods(models, tokenizer, ["plain", "chain_tri"])
