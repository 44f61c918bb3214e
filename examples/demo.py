"""draftcore's main job on the embedded default.

With the HF backend installed (the `hf` extra, as `make demo` installs it) this decodes HumanEval
prompts with SmolLM2-135M-Instruct, plain greedy against draftcore, and prints speed, tokens per
step and whether the outputs are identical. Without it, it replays recorded SmolLM2 traces.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def replay_demo() -> None:
    from draftcore import TrieDrafter
    from draftcore.tools.replay import replay
    from draftcore.tools.traces import read_traces
    path = os.path.join(HERE, "..", "..", "shared", "data", "traces_smollm2_greedy.jsonl")
    traces = read_traces(path)
    print(f"Replaying {len(traces)} recorded SmolLM2 greedy traces (no model: the trace is the model)")
    for name, drafter in [("paper trie", TrieDrafter.paper()), ("draftcore trie", TrieDrafter())]:
        for dataset, s in replay(traces, drafter, budget=64, eos_token_id=2).items():
            print(f"  {name:<15} {dataset:<10} tokens/step {s.tokens_per_step:5.2f}   "
                  f"drafting {s.draft_us(0.5):5.1f} µs/step (p90 {s.draft_us(0.9):5.1f})")


def main() -> int:
    try:
        from draftcore.adapters.torch_hf.demo import run_demo
    except ImportError:
        replay_demo()
        return 0
    return run_demo()


if __name__ == "__main__":
    sys.exit(main())
