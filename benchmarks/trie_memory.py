"""Memory is bounded: insert 10^6 tokens into a trie of fixed capacity, across many requests,
and check after every chunk that the live node count never exceeds the capacity.

    python benchmarks/trie_memory.py [--tokens 1000000] [--capacity 65536]
"""
import argparse
import time

import numpy as np
from _common import write_json

from draftcore import TrieDrafter
from draftcore.tools.report import make_report, show_table


def main(total_tokens=1_000_000, capacity=1 << 16, request_tokens=2_000, chunk=4, vocab=2_000):
    rng = np.random.default_rng(0)
    drafter = TrieDrafter(capacity=capacity)
    # A Zipf-like stream with repeated phrases, so some branches are frequent and some are not.
    phrases = [rng.integers(0, vocab, rng.integers(3, 30)).astype(np.int32) for _ in range(500)]
    max_nodes, inserted, t0 = 0, 0, time.perf_counter()
    while inserted < total_tokens:
        parts = [phrases[i] for i in rng.zipf(1.3, 200) % len(phrases)]
        stream = np.concatenate(parts)[:request_tokens]
        request = drafter.start(stream[:100])
        for i in range(100, stream.shape[0], chunk):
            request.update(stream[i:i + chunk])
            request.propose(stream[:i + chunk], 32)
            max_nodes = max(max_nodes, drafter.n_nodes)
            assert drafter.n_nodes <= capacity
        request.finish()
        inserted += stream.shape[0]
    drafter.check_integrity()
    seconds = time.perf_counter() - t0
    row = [f"{inserted:,}", f"{capacity:,}", f"{max_nodes:,}", f"{drafter.n_nodes:,}", f"{seconds:.1f}s"]
    shown = show_table("", ["tokens inserted", "capacity", "max live nodes", "live nodes at end", "time"], [row])
    report = make_report("A trie of fixed capacity stays within it", [shown])
    print("wrote", write_json("trie_memory.json", report, inserted=inserted, capacity=capacity, max_nodes=max_nodes))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--tokens", type=int, default=1_000_000, help="tokens inserted in all")
    parser.add_argument("--capacity", type=int, default=1 << 16, help="the trie's node capacity")
    args = parser.parse_args()
    main(total_tokens=args.tokens, capacity=args.capacity)
