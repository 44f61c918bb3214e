"""Streaming text: pieces never split a character, and joined they are the whole text.

SmolLM2's byte-level BPE splits 日, 語 and an emoji across tokens; pushing the ids one at a time, in
random chunks or all at once gives the same text, and no piece holds a broken character."""
import numpy as np
import pytest

import draftcore
from draftcore import ConfigError
from draftcore.text import IncrementalText
from fixtures.toy import ToyModel, ToyVerifier

TEXT = "Café 日本語 🙂 naïve — ok; ünïcödé ✓ 中文字符 end"


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("transformers")
    from draftcore.adapters.torch_hf.smollm2 import load_smollm2_tokenizer
    return load_smollm2_tokenizer()


def decode_with(tokenizer):
    return lambda ids: tokenizer.decode(np.asarray(ids).tolist())


def pieces(decode, context, ids, cuts):
    text = IncrementalText(decode, context)
    out = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        out.append(text.push(ids[a:b]))
    out.append(text.flush())
    return out


def test_multibyte_characters_decode_identically_chunked_and_whole(tokenizer):
    decode = decode_with(tokenizer)
    context = tokenizer.encode("Say it:")
    ids = tokenizer.encode(" " + TEXT)
    assert any("\ufffd" in decode([i]) for i in ids)   # some token is a partial character: the test can fail
    whole = decode(context + ids)[len(decode(context)):]
    assert whole == " " + TEXT
    rng = np.random.default_rng(0)
    splits = [list(range(len(ids) + 1)), [0, len(ids)]]
    splits += [[0] + sorted(rng.choice(np.arange(1, len(ids)), size=k, replace=False).tolist()) + [len(ids)]
               for k in (3, 7, 12) for _ in range(5)]
    for cuts in splits:
        got = pieces(decode, context, ids, cuts)
        assert "".join(got) == whole, cuts
        assert not any("\ufffd" in piece for piece in got), (cuts, got)


def test_an_incomplete_last_character_is_flushed_as_the_decoder_shows_it(tokenizer):
    decode = decode_with(tokenizer)
    ids = tokenizer.encode("日本")
    cut = next(i for i in range(1, len(ids)) if decode(ids[:i]).endswith("\ufffd"))
    text = IncrementalText(decode)
    assert text.push(ids[:cut]) == decode(ids[:cut]).rstrip("\ufffd")
    assert text.flush() == decode(ids[:cut])[len(decode(ids[:cut]).rstrip("\ufffd")):]


class TextToyVerifier(ToyVerifier):
    """A toy verifier whose tokens decode to whole and partial UTF-8 characters (the held-back path)."""

    def decode(self, ids):
        data = b"".join(("é日🙂"[i % 3].encode() if i % 4 else b"\xe6\x97") for i in np.asarray(ids).tolist())
        return data.decode("utf-8", errors="replace")


def test_speculate_stream_text_joins_to_the_result_text():
    verifier = TextToyVerifier(ToyModel(vocab_size=24, seed=3))
    prompt = np.array([1, 2, 3, 4, 5, 1, 2, 3], np.int32)
    with draftcore.speculate_stream(verifier, prompt, max_new_tokens=40) as stream:
        got = list(stream.text())
    tokens = stream.result.tokens
    whole = verifier.decode(np.concatenate([prompt[-4:], tokens]))[len(verifier.decode(prompt[-4:])):]
    assert "".join(got) == whole and len(got) > 1


def test_text_without_a_decoder_is_refused():
    verifier = ToyVerifier(ToyModel(vocab_size=24, seed=3))
    with draftcore.speculate_stream(verifier, [1, 2, 3], max_new_tokens=4) as stream:
        with pytest.raises(ConfigError, match="text: the verifier has no decode"):
            next(stream.text())
    with pytest.raises(ConfigError, match="decode: expected a callable"):
        IncrementalText("not a function")
