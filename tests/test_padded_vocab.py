"""A model's vocabulary padded to N tokens (draftcore/tools/padded_vocab.py, #87): the real tokens'
logits unchanged bit for bit, so greedy answers are the source's, at a large vocabulary's head cost;
on the tiny F32 fixture (every property, fast) and once on SmolLM2 at 128,256 tokens; and the
options that run it (`draftcore bench --vocab`, benchmarks/floor.py --vocab) with their refusals."""
import os

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")

from draftcore.errors import ConfigError, InputError  # noqa: E402
from draftcore.tools import backends, cli  # noqa: E402
from draftcore.tools.padded_vocab import PAD_TOKEN, padded_vocab_gguf  # noqa: E402
from draftcore.tools.results import measurement, subject_of  # noqa: E402

TINY_VOCAB, TINY_PADDED = 512, 640
UNUSED = int(gguf.TokenType.UNUSED)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """The tests' tiny random Llama as an F32 GGUF (fixtures/gguf_writer.py), vocabulary 512."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fixtures.gguf_writer import write_tiny_llama_gguf
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_llama_gguf(path, seed=0, vocab_size=TINY_VOCAB)
    return path


@pytest.fixture(scope="module")
def tiny_padded(tiny_gguf, tmp_path_factory):
    return padded_vocab_gguf(tiny_gguf, TINY_PADDED, cache_dir=tmp_path_factory.mktemp("cache"))


def _llama(path, **options):
    return llama_cpp.Llama(str(path), n_ctx=256, n_threads=1, n_threads_batch=1, logits_all=True, verbose=False,
                           **options)


def _logits(llm, ids) -> np.ndarray:
    llm.reset()
    llm.eval(list(ids))
    return np.array(llm.scores[:len(ids)])


def _greedy(llm, ids, n) -> list[int]:
    llm.reset()
    out = []
    for token in llm.generate(list(ids), top_k=1, temp=0.0, repeat_penalty=1.0):
        out.append(token)
        if len(out) == n:
            return out


def test_the_padded_file_copies_every_key_and_tensor_and_pads_only_the_vocabulary(tiny_gguf, tiny_padded):
    source, padded = gguf.GGUFReader(str(tiny_gguf)), gguf.GGUFReader(str(tiny_padded))
    tokens = padded.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == TINY_PADDED and tokens[:TINY_VOCAB] == source.fields["tokenizer.ggml.tokens"].contents()
    assert tokens[TINY_VOCAB:] == [PAD_TOKEN.format(i) for i in range(TINY_VOCAB, TINY_PADDED)]
    types = padded.fields["tokenizer.ggml.token_type"].contents()
    assert types[TINY_VOCAB:] == [UNUSED] * (TINY_PADDED - TINY_VOCAB)
    assert len(padded.fields["tokenizer.ggml.scores"].contents()) == TINY_PADDED
    assert padded.fields["llama.vocab_size"].contents() == TINY_PADDED
    per_token = {"tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores", "llama.vocab_size"}
    for key, field in source.fields.items():
        if key not in per_token and not key.startswith("GGUF."):
            assert padded.fields[key].contents() == field.contents(), key
    padded_tensors = {t.name: t for t in padded.tensors}
    assert [t.name for t in padded.tensors] == [t.name for t in source.tensors]
    for tensor in source.tensors:
        new = padded_tensors[tensor.name]
        assert new.tensor_type == tensor.tensor_type
        if tensor.name not in ("token_embd.weight", "output.weight"):
            assert np.array_equal(new.data, tensor.data), tensor.name
            continue
        # the fixture's head is untied (output.weight): both matrices keep their rows and gain copies
        # of one real row, the same one in both
        assert new.data.shape[0] == TINY_PADDED and np.array_equal(new.data[:TINY_VOCAB], tensor.data)
        assert (new.data[TINY_VOCAB:] == new.data[-1]).all()
        donors = [i for i in range(TINY_VOCAB) if np.array_equal(new.data[i], new.data[-1])]
        assert len(donors) == 1
        assert donors[0] == _donor(padded_tensors["output.weight"].data)
    assert "output.weight" in padded_tensors


def _donor(rows) -> int:
    return next(i for i in range(TINY_VOCAB) if np.array_equal(rows[i], rows[-1]))


def test_llama_cpp_loads_it_with_the_same_real_logits_and_greedy_answers(tiny_gguf, tiny_padded):
    """Bit-identical logits for the real tokens; a pad token's logit ties its donor's at most, so it
    never wins (the lower id does) and greedy output is the source's token for token."""
    source, padded = _llama(tiny_gguf), _llama(tiny_padded)
    assert (source.n_vocab(), padded.n_vocab()) == (TINY_VOCAB, TINY_PADDED)
    for prompt in ([1, 300, 301, 302, 303, 300, 301, 302], [1] + list(range(400, 420))):
        real, both = _logits(source, prompt), _logits(padded, prompt)
        assert np.array_equal(both[:, :TINY_VOCAB], real)
        assert (both[:, TINY_VOCAB:].max(axis=1) <= real.max(axis=1)).all()
        assert _greedy(padded, prompt, 24) == _greedy(source, prompt, 24)
    assert padded.detokenize([TINY_VOCAB]) == b""   # an UNUSED token writes nothing


def test_padding_is_cached_by_source_and_refused_below_the_source_vocabulary(tiny_gguf, tmp_path):
    first = padded_vocab_gguf(tiny_gguf, TINY_PADDED, cache_dir=tmp_path)
    written = first.stat().st_mtime_ns
    assert padded_vocab_gguf(tiny_gguf, TINY_PADDED, cache_dir=tmp_path) == first
    assert first.stat().st_mtime_ns == written   # found, not written again
    assert first.name.startswith(f"tiny-vocab{TINY_PADDED}-") and first.suffix == ".gguf"
    assert sorted(os.listdir(tmp_path)) == [first.name]   # no temporary file left behind
    assert padded_vocab_gguf(tiny_gguf, TINY_VOCAB, cache_dir=tmp_path) == tiny_gguf   # nothing to pad
    changed = tmp_path / "tiny.gguf"
    changed.write_bytes(tiny_gguf.read_bytes())   # another source (path, time): padded again, not served stale
    assert padded_vocab_gguf(changed, TINY_PADDED, cache_dir=tmp_path) != first
    with pytest.raises(ConfigError, match=r"vocab_size: expected at least the source's 512 tokens.*got 500"):
        padded_vocab_gguf(tiny_gguf, 500, cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="vocab_size: expected an int"):
        padded_vocab_gguf(tiny_gguf, 600.0, cache_dir=tmp_path)
    with pytest.raises(InputError, match="source_gguf: expected a GGUF file"):
        padded_vocab_gguf(tmp_path / "missing.gguf", TINY_PADDED, cache_dir=tmp_path)


def test_smollm2_padded_to_128256_answers_as_smollm2(packaged_gguf, tmp_path):
    """The real model: token_embd stays Q8_0 (what llama.cpp's own Q4_1 quantizer gives a 576-column
    tied embedding), the other matrices Q4_1; logits of the real tokens bit-identical, greedy equal."""
    from draftcore.tools.backends.prompts import load_tokenizer
    pytest.importorskip("transformers")
    path = padded_vocab_gguf(packaged_gguf, 128256, cache_dir=tmp_path)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert types["token_embd.weight"] == "Q8_0" and types["blk.0.ffn_up.weight"] == "Q4_1"
    source, padded = _llama(packaged_gguf, flash_attn=True), _llama(path, flash_attn=True)
    assert padded.n_vocab() == 128256
    tokenizer = load_tokenizer()
    for question in ("What is the capital of France?", "Write a Python function that reverses a string."):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                               tokenize=True, return_dict=False)
        real, both = _logits(source, prompt), _logits(padded, prompt)
        assert np.array_equal(both[:, :real.shape[1]], real)
        assert _greedy(padded, prompt, 24) == _greedy(source, prompt, 24)


@pytest.mark.parametrize("argv, words", [
    (["--backend", "llamacpp", "--vocab", "262144", "--model", "x.gguf"], ["vocab", "262144", "x.gguf"]),
    (["--backend", "toy", "--vocab", "262144"], ["vocab", "'toy'", "no such model option"]),
])
def test_bench_refuses_vocab_with_a_model_path_or_another_backend(argv, words, capsys, monkeypatch):
    monkeypatch.setattr(backends, "_registered", {})
    backends.register_backend("toy", "fake_backend")
    assert cli.main(["bench", *argv, "--n", "1", "--out", "/tmp/unused"]) == 2
    err = capsys.readouterr().err
    assert all(word in err for word in words), err


def test_bench_refuses_a_vocabulary_below_smollm2s(packaged_gguf, capsys):
    assert cli.main(["bench", "--backend", "llamacpp", "--vocab", "1000", "--n", "1", "--out", "/tmp/unused"]) == 2
    assert "expected at least the source's 49152 tokens" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["bench", "--backend", "llamacpp", "--vocab", "0"])


def test_floor_refuses_vocab_without_the_llamacpp_backend(monkeypatch):
    import importlib.util
    folder = os.path.join(os.path.dirname(__file__), "..", "benchmarks")
    monkeypatch.syspath_prepend(folder)   # the script imports its _common
    spec = importlib.util.spec_from_file_location("floor", os.path.join(folder, "floor.py"))
    floor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floor)
    with pytest.raises(ConfigError, match="--vocab: pads the llama.cpp backend's model"):
        floor.main(["--backends", "hf", "--vocab", "262144"])


def test_a_padded_run_is_its_own_measurement_beside_smollm2s():
    """docs/results.md keeps the newest run of each measurement: a --vocab run must not replace
    SmolLM2's row as a repeat of it."""
    machine = {"cpu": "x", "vector_isa": "AVX-512"}
    plain = {"command": "draftcore bench --backend llamacpp", "machine": machine, "date": "2025-01-01"}
    padded = {**plain, "command": "draftcore bench --backend llamacpp --vocab 262144"}
    assert subject_of(padded) == ("vocab-262144",) and subject_of(plain) == ()
    assert measurement(padded) != measurement(plain)
