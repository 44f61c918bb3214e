"""The GPU check: every backend on a GPU, exactness and speed, in one prepared run (docs/gpu.md).

    make gpu-check                   # a CUDA machine: SmolLM2 (staged by gpu_stage.py), 10 HumanEval +
                                     # 10 MT-Bench prompts, 128 new tokens
    make gpu-check DEVICE=cpu        # the small mode CI runs: the tiny random Llama on the CPU, the
                                     # same sections through the same code

Sections, in this order, each written to OUT/gpu_check.json and OUT/gpu_check.md as soon as it is done
(a run cut short still returns what it measured):
    env       the machine: GPU, driver-side versions, what each backend has
    hf        HF transformers in fp32 and bf16: first HFVerifier.verify's wall time by tree size (1, 2,
              4, ..., 64 nodes: the table a budget's and the vLLM proposer's defaults for the device
              start from), then plain generate(), transformers' prompt lookup, nodraft, trie and
              composite with the auto budget; identical outputs, and for each output that differs
              the position of its first difference, plain decoding's logit gap there between its
              top-1 token and the other output's, and a verdict (near-tie within NEAR_TIE, else BUG:
              draftcore.tools.near_ties), and the tree and window sizes the budget settles on
    onnx      ONNX Runtime (CUDA EP on a GPU) with IO binding: plain and tree mode on draftcore's fp32
              export, and the verify cost
    onnx chain  where onnxruntime-genai is installed: chain mode on its build (fp16 on CUDA) beside
              genai's own greedy and n-gram speculation, against plain decoding through that build
    llamacpp  llama.cpp with every layer offloaded (a child process that imports llama_cpp before
              numba: a CUDA build of it crashed where numba's LLVM came first): plain, prompt lookup,
              LlamaCppVerifier with the auto budget, and its cost
A section that cannot run says why in its place (a CPU-only onnxruntime, no CUDA build of llama.cpp).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))   # gpu_stage, when this file is loaded by path (the CI test)
sys.path.insert(0, str(HERE.parent / "tests"))   # fixtures.tiny_llama and fixtures.gguf_writer (not installed)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from gpu_stage import STAGE, assemble, staged_prompts  # noqa: E402

STARTED = time.time()
HF_METHODS = ("plain", "prompt_lookup", "nodraft", "trie", "composite")
ONNX_METHODS = ("plain", "nodraft", "trie")
ONNX_CHAIN_METHODS = ("plain_chain", "genai", "genai_ngram", "chain_nodraft", "chain_trie")
LLAMACPP_METHODS = ("plain", "prompt_lookup", "trie")
SIZES = (1, 2, 4, 8, 16, 32, 64)
ALL_SECTIONS = "hf,onnx,llamacpp"
# Greedy near-tie bound per dtype on plain decoding's logit gap between its top-1 token and the other
# output's at their first difference: k-token and one-token forwards round differently (docs/design.md,
# "Numerics"); a first difference above it is a bug.
# ONNX Runtime's CUDA EP runs float32 matmuls in TF32 by default: fp16's mantissa, so fp16's bound.
# llama.cpp on quantized weights: its batch kernels differ from its one-token ones (docs/design.md,
# "Numerics": up to 1.5).
NEAR_TIE = {"float32": 1e-2, "bfloat16": 0.5, "float16": 0.1, "tf32": 0.1, "quantized": 1.5}


class Check:
    """The run's results, rewritten to OUT after every section."""

    def __init__(self, out: Path, args):
        self.out = out
        self.data = {"config": {k: v for k, v in vars(args).items() if k != "func"}, "sections": {}}
        out.mkdir(parents=True, exist_ok=True)

    def add(self, name: str, section: dict, quiet: bool = False) -> None:
        section["seconds"] = round(time.time() - STARTED, 1)
        self.data["sections"][name] = section
        self.data["report"] = report_of(self.data)
        (self.out / "gpu_check.json").write_text(json.dumps(self.data, indent=1, default=str))
        (self.out / "gpu_check.md").write_text(markdown(self.data))
        if not quiet:
            print(f"[{section['seconds']:.0f} s] {name}: {(section.get('skipped') or 'done').strip().splitlines()[-1]}", flush=True)


# ---------------------------------------------------------------- the model and prompts of each mode

def small_mode(args) -> bool:
    return args.model == "tiny"


def tiny_model():
    """The tiny random Llama every backend runs in the small mode (vocab 512: the GGUF writer's
    smallest with a byte vocabulary)."""
    from fixtures.tiny_llama import tiny_llama
    return tiny_llama(seed=0, vocab_size=512)


def tiny_prompts(n: int):
    """Prompts for the tiny model: a repeated block (drafts from the prompt pay) and random ids."""
    from draftcore.tools.bench import Prompt
    rng = np.random.default_rng(0)
    prompts = []
    for i in range(n):
        block = rng.integers(3, 512, 12)
        prompts.append(Prompt("repeat", i, np.concatenate([block, block, block[:6]]).astype(np.int32)))
    for i in range(n):
        prompts.append(Prompt("random", i, rng.integers(3, 512, 40).astype(np.int32)))
    return prompts, [1]


def smollm2_prompts(args):
    from draftcore.tools.bench import Prompt
    staged = staged_prompts(Path(args.stage))
    if staged is not None:
        prompts = [Prompt(p["dataset"], p["idx"], np.asarray(p["ids"], np.int32)) for p in staged["prompts"]
                   if p["idx"] < args.n + 1]
        return prompts, staged["eos"]
    from draftcore.adapters.torch_hf.smollm2 import load_smollm2_tokenizer
    from draftcore.tools.backends.prompts import load_prompts
    tokenizer = load_smollm2_tokenizer()
    prompts = [p for d in ("humaneval", "mtbench") for p in load_prompts(tokenizer, d, args.n + 1)]
    return prompts, [int(tokenizer.eos_token_id)]


def smollm2_folder(args) -> Path:
    """SmolLM2's converted HF folder: from the staged GGUF where the package is missing."""
    from draftcore.adapters.torch_hf.smollm2 import converted_folder
    gguf, why = assemble(Path(args.stage))
    if gguf is None:
        try:
            return converted_folder()
        except Exception as exc:   # no package, no stage: say both
            raise RuntimeError(f"SmolLM2: {why}; and {exc}") from exc
    cache = Path(args.stage) / "cache"
    os.environ["DRAFTCORE_CACHE"] = str(cache)   # where load_smollm2 (the backends' loader) looks
    return converted_folder(cache, gguf=gguf)


# ---------------------------------------------------------------- sections

def env_section(args) -> dict:
    import torch
    info = {"date": time.strftime("%Y-%m-%d %H:%M %z"), "python": platform.python_version(),
            "machine": platform.machine(), "processor": _cpu_name(), "logical_cores": os.cpu_count(),
            "torch": torch.__version__, "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda)
    for module in ("transformers", "numba", "numpy", "onnxruntime"):
        try:
            info[module] = __import__(module).__version__
        except ImportError as exc:
            info[module] = f"missing ({exc})"
    try:
        import onnxruntime
        info["onnxruntime_providers"] = onnxruntime.get_available_providers()
    except ImportError:
        pass
    return info


def hf_section(args, prompts, eos, dtype: str, save) -> dict:
    """HF in `dtype`: the verify cost by tree size first, then the methods, dataset by dataset
    (`save(section)` after each part)."""
    import torch
    from draftcore.tools.backends import hf
    if small_mode(args):
        model, tokenizer = tiny_model().to(device=args.device, dtype=getattr(torch, dtype)), None
    else:
        smollm2_folder(args)
        model, tokenizer = hf.load_model(None, dtype=dtype, device=args.device)
    outputs = {}
    methods = [_capturing(m, outputs) for m in hf.make_methods(model, tokenizer, HF_METHODS, eos_token_id=eos[0])]
    verifier = methods[HF_METHODS.index("trie")].verifier
    # The cost table with sdpa as torch picks it (the verifier's cuDNN-free twins, if any, set
    # aside), then with cuDNN's attention ruled out: whether cuDNN is what a half-precision tree
    # verify pays for on this GPU (docs/gpu.md)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with verifier.first_forwards_only():
        section = {"attn": model.config._attn_implementation,
                   "ms_by_nodes": verify_cost_ms(verifier, SIZES, args.n_past, args.reps)}
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        section["ms_by_nodes_without_cudnn"] = verify_cost_ms(verifier, SIZES, args.n_past, args.reps, seed=2)
    save(section)

    def near_ties(records):
        return _divergences(records, outputs, prompts, methods[0].name, lambda ids: _hf_logits(model, ids),
                            NEAR_TIE[dtype])

    _bench(methods, prompts, args, section, save, near_ties)
    section["kernel_choices"] = verifier.kernel_choices
    # again after the methods ran: a cost that moved tells a warm-up or a state effect from the table
    with verifier.first_forwards_only():
        section["ms_by_nodes_after"] = verify_cost_ms(verifier, SIZES, args.n_past, args.reps, seed=1)
    return section


def _ort_provider(args):
    """(onnxruntime's provider name for the device, None) or (None, why the section cannot run)."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return None, f"onnxruntime is not installed ({exc})"
    provider = "CUDAExecutionProvider" if args.device == "cuda" else "CPUExecutionProvider"
    if args.device == "cuda" and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()   # the CUDA and cuDNN libraries of the nvidia-* packages torch brought
    if provider not in ort.get_available_providers():
        return None, (f"onnxruntime {ort.__version__} here has no {provider} (providers: "
                      f"{ort.get_available_providers()}); the CUDA EP needs onnxruntime-gpu (docs/gpu.md)")
    return provider, None


def onnx_section(args, prompts, eos, save) -> dict:
    """Tree mode on draftcore's fp32 export, against plain decoding through the same session."""
    provider, why = _ort_provider(args)
    if provider is None:
        return {"skipped": why}
    from draftcore.adapters.onnx.builds import tree_export
    from draftcore.tools.backends import onnx
    folder = _tiny_hf_folder(args) if small_mode(args) else smollm2_folder(args)
    tree = tree_export(folder, "float32", cache_dir=Path(args.stage) / "cache")
    models = onnx.OnnxModels(str(folder), str(tree), None, None, [provider], list(eos))
    return _ort_bench(models, ONNX_METHODS, "trie", NEAR_TIE["tf32" if args.device == "cuda" else "float32"], {},
                      args, prompts, eos, save)


def onnx_chain_section(args, prompts, eos, save) -> dict:
    """Chain mode on onnxruntime-genai's own build, beside genai's greedy and its n-gram speculation,
    against plain decoding through the same build. On CUDA the build is fp16, what genai makes for
    that device: genai 0.18's fp32 CUDA build is not a valid graph (its present.N.key outputs are
    produced by no node; seen on an H200 and reproduced on the CPU)."""
    provider, why = _ort_provider(args)
    if provider is None:
        return {"skipped": why}
    from draftcore.adapters.onnx.builds import genai_build
    from draftcore.errors import ConfigError
    from draftcore.tools.backends import onnx
    folder = _tiny_hf_folder(args) if small_mode(args) else smollm2_folder(args)
    dtype = "float16" if args.device == "cuda" else "float32"
    try:
        genai = genai_build(folder, dtype, execution_provider=args.device, cache_dir=Path(args.stage) / "cache")
    except ConfigError as exc:
        return {"skipped": str(exc)}
    models = onnx.OnnxModels(str(folder), None, str(genai), None, [provider], list(eos))
    return _ort_bench(models, ONNX_CHAIN_METHODS, "chain_trie", NEAR_TIE[dtype], {"dtype": dtype},
                      args, prompts, eos, save)


def _ort_bench(models, names, timed: str, bound: float, section: dict, args, prompts, eos, save) -> dict:
    """The ONNX methods `names` side by side (the first is the baseline), after the verify cost of
    method `timed`'s verifier, whose session also gives plain decoding's logits where outputs differ."""
    from draftcore.tools.backends import onnx
    outputs = {}
    methods = [_capturing(m, outputs) for m in onnx.make_methods(models, None, list(names), eos_token_id=eos)]
    verifier = methods[names.index(timed)].verifier
    section["ms_by_nodes"] = verify_cost_ms(verifier, SIZES, args.n_past, args.reps)
    return _bench(methods, prompts, args, section, save,
                  lambda records: _divergences(records, outputs, prompts, methods[0].name, _logits_through(verifier),
                                               bound))


def llamacpp_section(args) -> dict:
    """Run in a child process (`--section llamacpp`), which imports llama_cpp before anything else."""
    out = Path(args.out) / "llamacpp.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, __file__, "--section", "llamacpp", *_passed_arguments(args)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.llamacpp_timeout)
    if out.is_file():
        return json.loads(out.read_text())
    return {"skipped": f"the llama.cpp child process failed (exit {done.returncode}): {done.stderr[-1500:]}"}


def llamacpp_child(args) -> None:
    """The child's work: written to OUT/llamacpp.json."""
    try:
        import llama_cpp   # before numba (module docstring)
    except ImportError as exc:
        section = {"skipped": f"llama-cpp-python is not installed ({exc}); a CUDA build needs its 73 MiB "
                              f"source and nvcc there (docs/gpu.md)"}
    else:
        if args.device == "cuda" and not llama_cpp.llama_supports_gpu_offload():
            section = {"skipped": f"llama-cpp-python {llama_cpp.__version__} here is a CPU build (no GPU offload)"}
        else:
            section = _llamacpp_measure(args)
    (Path(args.out) / "llamacpp.json").write_text(json.dumps(section, default=str))


def _llamacpp_measure(args) -> dict:
    from draftcore.selfcheck import chain_against_one_token
    from draftcore.tools.backends import llamacpp
    if small_mode(args):
        from fixtures.gguf_writer import write_llama_gguf
        path = Path(args.stage) / "cache" / "tiny.gguf"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_llama_gguf(tiny_model(), path)
        prompts, eos = tiny_prompts(args.n + 1)
    else:
        path, why = assemble(Path(args.stage))
        if path is None:
            from draftcore.tools.backends.default_model import default_gguf
            path = default_gguf()
        prompts, eos = smollm2_prompts(args)
    handle, _ = llamacpp.load_model(str(path), device=args.device)
    outputs = {}
    methods = [_capturing(m, outputs) for m in llamacpp.make_methods(handle, None, LLAMACPP_METHODS, eos_token_id=eos)]
    verifier = methods[LLAMACPP_METHODS.index("trie")].verifier
    section = {"offloaded": args.device != "cpu", "ms_by_nodes": verify_cost_ms(verifier, SIZES, args.n_past,
                                                                                args.reps),
               "split_attention_from": verifier.split_attention_from, "kv_cache": llamacpp.model_settings(handle)["kv_cache"],
               "chain_vs_one_token": {n: chain_against_one_token(verifier, n) for n in LONG_CONTEXTS}}
    bound = NEAR_TIE["float32" if small_mode(args) else "quantized"]   # the tiny GGUF's weights are float32
    return _bench(methods, prompts, args, section, lambda section: None,
                  lambda records: _divergences(records, outputs, prompts, methods[0].name,
                                               _logits_through(verifier), bound))


# ---------------------------------------------------------------- measuring

def verify_cost_ms(verifier, sizes, n_past: int, reps: int, seed: int = 0, with_commit: bool = False,
                   samples: dict | None = None) -> dict:
    """{nodes: median ms of one verify of a random tree of that many nodes after ~n_past tokens}.

    Each sample verifies a fresh random tree, then commits the root alone (as decoding does); the
    verify returns host arrays, so the device's work is done when it returns. Sizes above the
    verifier's own limit are left out; a verifier of chains only (max_tree_leaves 1) gets chains.
    `with_commit`: the commit is timed too (a whole step, as the auto budget measures it);
    `samples`: filled with {nodes: every timed sample's ms}."""
    from draftcore.tree import DraftTree
    limit = getattr(verifier, "max_tree_nodes", None) or max(sizes)
    chains_only = getattr(verifier, "max_tree_leaves", None) == 1
    rng = np.random.default_rng(seed)
    table = {}
    for n in (s for s in sizes if s <= limit):
        verifier.prefill(rng.integers(3, verifier.vocab_size, n_past).astype(np.int32))
        parents = (np.arange(-1, n - 1) if chains_only
                   else np.r_[-1, [rng.integers(0, i) for i in range(1, n)]]).astype(np.int32)
        times = []
        for _ in range(reps + 2):   # two warm-ups
            tree = DraftTree.build(rng.integers(3, verifier.vocab_size, n).astype(np.int32), parents)
            t0 = time.perf_counter()
            verifier.verify(tree)
            if with_commit:
                verifier.commit(np.zeros(1, np.int32))
            times.append(time.perf_counter() - t0)
            if not with_commit:
                verifier.commit(np.zeros(1, np.int32))
        table[n] = round(float(np.median(times[2:])) * 1e3, 3)
        if samples is not None:
            samples[n] = [t * 1e3 for t in times[2:]]
    return table


def _bench(methods, prompts, args, section: dict, save, divergences) -> dict:
    """The methods side by side (bench.run_benchmark), one dataset at a time, into `section`, saved
    after each; a dataset is left out once the run is past --deadline seconds (its note says so)."""
    from draftcore.tools.bench import run_benchmark, summarize
    records = []
    for dataset in dict.fromkeys(p.dataset for p in prompts):
        if time.time() - STARTED > args.deadline:
            section["note"] = (section.get("note", "") + f" {dataset} left out: the run passed its deadline of "
                               f"{args.deadline:.0f} s.").strip()
            break
        records += run_benchmark(methods, [p for p in prompts if p.dataset == dataset], args.max_new_tokens, warmup=1)
        section.update(rows=summarize(records, baseline=methods[0].name), settled=_settled(records),
                       divergences=divergences(records), records=records)
        save(section)
    return section


def _capturing(method, outputs: dict):
    """`method` whose every output is kept in outputs[(method name, prompt bytes)]."""
    import dataclasses
    run = method.run

    def kept(prompt_ids, max_new_tokens):
        result = run(prompt_ids, max_new_tokens)
        outputs[(method.name, np.asarray(prompt_ids, np.int32).tobytes())] = (np.asarray(prompt_ids), result.tokens)
        return result

    return dataclasses.replace(method, run=kept)


def _settled(records) -> dict:
    """Per (dataset, method) of a drafting method: the drafted nodes per step (median and 90th
    percentile over every step of the last half of the prompts, where the budget has settled) and
    the lookahead-window nodes per step."""
    settled = {}
    by_key: dict = {}
    for r in records:
        if r["budgets"]:
            by_key.setdefault((r["dataset"], r["method"]), []).append(r)
    for (dataset, method), rs in by_key.items():
        late = rs[len(rs) // 2:]
        counts = np.concatenate([np.repeat(list(map(int, r["budgets"])), list(r["budgets"].values())) for r in late])
        drafted = counts[counts > 0]
        if not drafted.size:
            continue   # nodraft: its budget is 0 by construction
        steps = counts.size
        settled[f"{dataset} / {method}"] = {
            "drafting_steps": round(drafted.size / steps, 2),
            "drafted_nodes_median": float(np.median(drafted)),
            "drafted_nodes_p90": float(np.percentile(drafted, 90, method="nearest")),   # a size that was drafted
            "window_nodes_per_step": round(sum(r["lookahead_nodes"] for r in late) / max(steps, 1), 2)}
    return settled


def _divergences(records, outputs, prompts, baseline: str, logits_after, bound) -> list[dict]:
    """Every greedy output that differs from the baseline's, explained (draftcore.tools.near_ties):
    where it first differs, the two tokens, plain decoding's logit gap between them there
    (logits_after(ids): plain decoding's logits after ids) and the verdict, near-tie within `bound`
    or BUG. A record that differed in a round whose output was not the one kept is a BUG too: a
    greedy method that differs from run to run is not explained by a near-tie of plain decoding."""
    from draftcore.tools.near_ties import BUG, explain
    ids = {(p.dataset, p.idx): np.asarray(p.ids, np.int32).tobytes() for p in prompts}
    found = []
    for r in records:
        if r["identical"] is not False:
            continue
        key = ids[(r["dataset"], r["idx"])]
        prompt, reference = outputs[(baseline, key)]
        explained = explain(prompt, reference, outputs[(r["method"], key)][1], logits_after, bound)
        if explained is None:
            explained = {"position": r["first_difference"], "plain_token": None, "other_token": None, "gap": None,
                         "verdict": BUG}
        found.append({"dataset": r["dataset"], "idx": r["idx"], "method": r["method"], **explained})
    return found


def _logits_through(verifier):
    """logits_after(ids) for _divergences: the logits after `ids`, from one prefill through a
    Verifier (ONNX: the plain method's own session; llama.cpp: the verifier's own context). The next
    prompt's prefill starts the verifier afresh."""
    def logits_after(ids) -> np.ndarray:
        return verifier.prefill(np.asarray(ids, np.int32), 1)[1][0]
    return logits_after


def _hf_logits(model, ids) -> np.ndarray:
    """Plain decoding's logits after `ids`: one forward of the model over them (float32)."""
    import torch
    with torch.inference_mode():
        return model(torch.as_tensor(ids, device=model.device)[None]).logits[0, -1].float().cpu().numpy()


# ---------------------------------------------------------------- output

def markdown(data: dict) -> str:
    """gpu_check.md: each section's tables (section_tables, the same the report keeps), with the
    env, a skipped part's reason, the divergences in words, the kernel choices and any note."""
    from draftcore.tools.report import markdown_table, table_text
    cfg = data["config"]
    lines = [f"# GPU check: {cfg['model']} on {cfg['device']}, {cfg['max_new_tokens']} new tokens, "
             f"{cfg['n']} prompts per dataset", ""]
    for name, section in data["sections"].items():
        lines.append(f"## {name}")
        if "skipped" in section:
            lines += ["", f"Not run: {section['skipped']}", ""]
            continue
        if name == "env":
            lines += ["", markdown_table(["", "value"], [[k, v] for k, v in section.items()]), ""]
            continue
        lines += ["", *(line for kept in section_tables(name, section) for line in (table_text(kept), ""))]
        if "divergences" in section:
            lines += [_divergence_line(section["divergences"]), ""]
        if section.get("kernel_choices"):
            lines += [f"The verifier's kernel choices after the runs: {section['kernel_choices']}", ""]
        if section.get("note"):
            lines += [section["note"], ""]
    return "\n".join(lines)


# Context lengths at which the llama.cpp section compares a 4-token chain with one-token decoding: its
# CPU flash attention splits one token's attention across threads from 257 cached tokens on (F16
# cache), and a verify's not (adapters/llamacpp/numerics.py); whether CUDA's kernels do alike is
# unmeasured.
LONG_CONTEXTS = (200, 300, 1000)

COST_TABLES = (("ms_by_nodes", "before the methods ran"),
               ("ms_by_nodes_without_cudnn", "before the methods ran, sdpa without cuDNN attention"),
               ("ms_by_nodes_after", "after them"))


def section_tables(name: str, sec: dict) -> list[dict]:
    """A measured section's tables (draftcore.tools.report.table): its methods side by side, where
    the budget settled, the verify cost by tree size and the outputs that differ from plain's."""
    from draftcore.tools.bench import summary_table
    from draftcore.tools.report import table
    tables = []
    if sec.get("rows"):
        tables.append(dict(summary_table(sec["rows"]), title=f"{name}: methods side by side"))
    if sec.get("settled"):
        tables.append(table(f"{name}: where the auto budget settled (last half of each dataset's prompts): the "
                            f"share of steps that drafted, and the drafted nodes of those steps",
                            ["dataset / method", "steps drafting", "drafted nodes (median)", "(p90)",
                             "window nodes per step"],
                            [[k, v["drafting_steps"], v["drafted_nodes_median"], v["drafted_nodes_p90"],
                              v["window_nodes_per_step"]] for k, v in sec["settled"].items()]))
    for key, when in COST_TABLES:
        if sec.get(key):
            tables.append(table(f"{name}: one verify's wall time by tree size, ms (median), {when}",
                                ["nodes", *sec[key]], [["ms", *sec[key].values()]]))
    if sec.get("chain_vs_one_token"):
        tables.append(table(f"{name}: largest |logit| difference, a 4-token chain verified at once against one "
                            f"token at a time, by cached tokens before it ({sec.get('kv_cache')} KV cache; the "
                            f"settings' rule says split attention from {sec.get('split_attention_from')})",
                            ["cached tokens", *sec["chain_vs_one_token"]],
                            [["difference", *(f"{d:.3g}" for d in sec["chain_vs_one_token"].values())]]))
    if sec.get("divergences"):
        tables.append(table(f"{name}: outputs that differ from plain decoding's (verdict: near-tie within the "
                            f"numerics bound, else BUG)",
                            ["method", "prompt", "first different token", "tokens (plain / other)",
                             "plain's logit gap there (top-1 - other's token)", "verdict"],
                            [[d["method"], f"{d['dataset']} {d['idx']}", d["position"], _tokens_cell(d),
                              _gap_cell(d), _verdict(d)] for d in sec["divergences"]]))
    return tables


# Runs before the competing tokens' gap was recorded kept plain's top-2 gap (top2_gap, near_tie), or
# none at all: those render as they were measured, and an unmeasured difference is unexplained.
def _verdict(d: dict) -> str:
    if "verdict" in d:
        return d["verdict"]
    if "near_tie" in d:
        return "near-tie" if d["near_tie"] else "BUG"
    return "BUG (no gap measured)"


def _gap_cell(d: dict) -> str:
    if d.get("gap") is not None:
        return f"{d['gap']:.3g}"
    return f"{d['top2_gap']:.3g} (top-2)" if "top2_gap" in d else "-"


def _tokens_cell(d: dict) -> str:
    if "plain_token" not in d:
        return "-"
    return " / ".join("(end)" if t is None else str(t) for t in (d["plain_token"], d["other_token"]))


def report_of(data: dict) -> dict:
    """The run as a report (draftcore.tools.report) that `draftcore results` renders into
    docs/results.md: the machine is the one the env section read (the run's, wherever the report is
    made), the tables those of gpu_check.md (section_tables)."""
    from draftcore.tools.report import table
    cfg, sections = data["config"], data["sections"]
    env = sections.get("env", {})
    tables = [table("What each part of the check did", ["part", "result"],
                    [[name, "done" if "skipped" not in sec else "unverified, not run: " + sec["skipped"].strip().splitlines()[-1]]
                     for name, sec in sections.items() if name != "env"])]
    for name, sec in sections.items():
        if name != "env" and "skipped" not in sec:
            tables += section_tables(name, sec)
    versions = {k: env[k] for k in ("numpy", "numba", "torch", "transformers", "onnxruntime") if k in env}
    machine = {"cpu": env.get("processor", "unknown"), "logical_cores": env.get("logical_cores"),
               "gpu": env.get("gpu"), "os": "", "python": env.get("python", "?"), "versions": versions}
    command = ("make gpu-check" + (" DEVICE=cpu" if cfg["device"] == "cpu" else "")
               + f"  (benchmarks/gpu_check.py --device {cfg['device']} --model {cfg['model']} --n {cfg['n']} "
                 f"--max-new-tokens {cfg['max_new_tokens']}"
                 + (f" --sections {cfg['sections']}" if cfg.get("sections", ALL_SECTIONS) != ALL_SECTIONS else "")
                 + ")")
    parts = "" if cfg.get("sections", ALL_SECTIONS) == ALL_SECTIONS else f" ({cfg['sections']})"
    return {"title": f"GPU check: {cfg['model']} on {env.get('gpu') or cfg['device']}{parts}", "command": command,
            "date": env.get("date", "unknown"), "machine": machine, "tables": tables}


def _divergence_line(divergences) -> str:
    if not divergences:
        return "Every greedy output identical to the baseline's."
    cells = [f"{d['method']} on {d['dataset']} {d['idx']} at token {d['position']} "
             f"(gap {_gap_cell(d)}: {_verdict(d)})" for d in divergences]
    return "Outputs that differ from the baseline's: " + "; ".join(cells) + "."


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _tiny_hf_folder(args) -> Path:
    from fixtures.tiny_llama import save_tiny_llama
    folder = Path(args.stage) / "cache" / "tiny-llama"
    if not (folder / "config.json").is_file():
        save_tiny_llama(folder, seed=0, vocab_size=512)   # tiny_model() with a tokenizer the genai builder reads
    return folder


def _passed_arguments(args) -> list[str]:
    return ["--device", args.device, "--model", args.model, "--stage", str(args.stage), "--out", str(args.out),
            "--n", str(args.n), "--max-new-tokens", str(args.max_new_tokens), "--n-past", str(args.n_past),
            "--reps", str(args.reps), "--deadline", str(args.deadline - (time.time() - STARTED))]


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--model", default=None, choices=["smollm2", "tiny"],
                    help="default: smollm2 on cuda, tiny on cpu (the small mode)")
    ap.add_argument("--stage", default=str(STAGE), help="the staged files (gpu_stage.py); caches go under it")
    ap.add_argument("--out", default=str(HERE.parent / "bench_out" / "gpu_check"))
    ap.add_argument("--n", type=int, default=None, help="recorded prompts per dataset (default 10; small mode 2)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 128; small mode 24")
    ap.add_argument("--n-past", type=int, default=None, help="context before a timed verify (default 200; small 32)")
    ap.add_argument("--reps", type=int, default=None, help="timed verifies per size (default 15; small mode 2)")
    ap.add_argument("--sections", default=ALL_SECTIONS)
    ap.add_argument("--deadline", type=float, default=float("inf"),
                    help="seconds after which no further dataset starts (a run the machine's limit would cut)")
    ap.add_argument("--llamacpp-timeout", type=int, default=300)
    ap.add_argument("--strict", action="store_true", help="exit non-zero when a section fails (CI's small mode)")
    ap.add_argument("--section", default=None, help=argparse.SUPPRESS)   # the llama.cpp child
    ap.add_argument("--render", metavar="RUN_JSON", help="only write RUN_JSON (a run's gpu_check.json) with its "
                                                         "report to --out (a file), for docs/results/")
    args = ap.parse_args(argv)
    small = (args.model or ("smollm2" if args.device == "cuda" else "tiny")) == "tiny"
    args.model = "tiny" if small else "smollm2"
    for name, full, tiny in (("n", 10, 2), ("max_new_tokens", 128, 24), ("n_past", 200, 32), ("reps", 15, 2)):
        if getattr(args, name) is None:
            setattr(args, name, tiny if small else full)
    return args


def render(run_json: str, out: str) -> None:
    """Write a fetched run's JSON again with its report (report_of), e.g. into docs/results/."""
    data = json.loads(Path(run_json).read_text())
    for section in data["sections"].values():   # as this version summarizes the records
        if section.get("records"):
            section["settled"] = _settled(section["records"])
    data["report"] = report_of(data)
    Path(out).write_text(json.dumps(data, indent=1, default=str))


def main(argv=None) -> dict:
    args = parse(argv)
    if args.render:
        render(args.render, args.out)
        return {}
    if args.section == "llamacpp":
        llamacpp_child(args)
        return {}
    check = Check(Path(args.out), args)
    check.add("env", env_section(args))
    sections = args.sections.split(",")
    prompts, eos = tiny_prompts(args.n + 1) if small_mode(args) else smollm2_prompts(args)
    runs = []
    if "hf" in sections:
        runs += [(f"hf {dtype}", lambda save, dtype=dtype: hf_section(args, prompts, eos, dtype, save))
                 for dtype in ("float32", "bfloat16")]
    if "onnx" in sections:
        runs.append(("onnx", lambda save: onnx_section(args, prompts, eos, save)))
        runs.append(("onnx chain", lambda save: onnx_chain_section(args, prompts, eos, save)))
    if "llamacpp" in sections:
        runs.append(("llamacpp", lambda save: llamacpp_section(args)))
    failed = []
    for name, run in runs:
        def save(section, name=name):
            check.add(name, section, quiet=True)
        try:
            check.add(name, run(save))
        except Exception:   # one backend's failure is its own result: the next still runs
            failed.append(name)
            check.add(name, {"skipped": "failed: " + traceback.format_exc()[-1500:]})
    if failed and args.strict:
        raise SystemExit(f"gpu_check: sections failed: {failed} (see {check.out / 'gpu_check.md'})")
    return check.data


if __name__ == "__main__":
    main()
