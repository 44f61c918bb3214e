"""draftcore's main job on the embedded default.

With the HF backend installed (the `hf` extra, as `make demo` installs it) this decodes HumanEval
prompts with SmolLM2-135M-Instruct, plain greedy against draftcore, and prints speed, tokens per
step and whether the outputs are identical. Without it, it replays the SmolLM2 greedy traces
recorded into benchmarks/data: no model runs, the recorded outputs answer for it.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = os.path.join(HERE, "..", "benchmarks", "data", "smollm2_greedy_traces.jsonl.gz")
EOS = 2  # SmolLM2's end-of-text id


def replay_demo() -> None:
    from draftcore import TrieDrafter
    from draftcore.tools.replay import replay
    from draftcore.tools.traces import read_traces
    traces = read_traces(TRACES)
    print(f"Replaying {len(traces)} recorded SmolLM2 greedy traces (no model: the recording answers for it);")
    print("speedups are simulated with verify costs measured for SmolLM2 fp32 on a 2-core CPU")
    runs = [("draftcore defaults", dict()),  # the bare call: the session's TrieDrafter and auto budget
            ("paper trie, 64", dict(drafter=TrieDrafter.paper, budget=64))]
    for name, options in runs:
        for dataset, s in replay(traces, eos_token_id=EOS, **options).items():
            print(f"  {name:<18} {dataset:<10} tokens/step {s.tokens_per_step:5.2f}   simulated speedup "
                  f"{s.speedup:4.2f}x   drafting {s.draft_us(0.5):5.1f} µs/step (p90 {s.draft_us(0.9):5.1f})")


def main() -> int:
    try:
        from draftcore.tools.backends.demo import run_demo
    except ImportError:
        replay_demo()
        return 0
    return run_demo()


if __name__ == "__main__":
    sys.exit(main())
