"""How many tokens per step a family of drafters could reach at best on recorded traces.

A replay (draftcore.tools.replay) says what one drafter does; these bounds say what no drafter of a
family can beat, so a target can be checked against the headroom before a drafter is built for it.
Each bound is an oracle that knows the recorded output and drafts, at every step, the longest
continuation its family could have drafted from what was seen so far: the earlier traces' prompts
and outputs, this prompt, and this output up to the step's root. The step then accepts that many
tokens plus the model's own. Always taking the longest is optimal: the position a step reaches
never decreases when it starts later, since a copy that reaches position p from an earlier start
reaches p from any start inside it too, and the seen text only grows.

    copy_bound(traces, context=1)   drafts that continue an occurrence of the context's last
                                    `context` tokens (the root included) in the seen text: a trie,
                                    prompt lookup, any retrieval of what followed a suffix
    chain_bound(traces, n)          drafts that compose n-grams: each drafted token follows its own
                                    last n - 1 tokens somewhere in the seen text (an n-gram table
                                    feeding its predictions back, ANPD)
    copy_or_frequent_bound(traces, k)   copy_bound(context=1), or where that drafts nothing, one
                                    token among the k most frequent tokens seen so far (the trie's
                                    last stage drafts the most frequent tokens, one token deep)

Each takes `max_draft` (the deepest draft a step may verify) and returns {dataset: tokens per step},
comparable with `replay(...)[dataset].tokens_per_step` of the traces in the same order.

Tokens per step are not speed: on a machine where a verify of many nodes costs several one-token
steps, the longest draft is not the fastest. So

    copy_speedup_bound(traces, cost, frequent=0)   the decode speedup over one-token steps of the
                                    best drafter of copy_bound's family (copy_or_frequent_bound's with
                                    `frequent`), verifies priced by `cost` (a CostModel's table)

takes, at every step, the draft length that makes the whole output fastest (a dynamic program
over the output's positions: what can be copied at a position depends only on the text before it,
not on the steps that reached it), and returns {dataset: speedup}, comparable with
`replay(..., cost=cost)[dataset].speedup`. A target above it cannot be met on that machine by any
drafter that copies from the context (a trie, prompt lookup, suffix decoding), however good.
`copy_decode_seconds(traces, costs)` gives the same per trace, each at its own costs (a request's
context sets them): benchmarks/end_to_end_bound.py adds the measured prefill and plain times, for a
bound on the speedup a user sees.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from ..errors import InputError
from ..validate import positive_int
from .cost_model import CostModel


def copy_bound(traces, *, context: int = 1, max_draft: int = 64) -> dict[str, float]:
    """Tokens per step of the best drafter whose drafts continue an occurrence of the last
    `context` tokens in the seen text (module docstring)."""
    context = positive_int("context", context)
    return _run(traces, max_draft, lambda: _CopyOracle(context, 0))


def copy_or_frequent_bound(traces, *, k: int = 64, max_draft: int = 64) -> dict[str, float]:
    """copy_bound(context=1), plus: where that drafts nothing, one token if the next token is
    among the `k` most frequent tokens seen so far."""
    k = positive_int("k", k)
    return _run(traces, max_draft, lambda: _CopyOracle(1, k))


def chain_bound(traces, *, n: int = 2, max_draft: int = 64) -> dict[str, float]:
    """Tokens per step of the best drafter whose drafted tokens each follow their own last n - 1
    tokens somewhere in the seen text."""
    n = positive_int("n", n, minimum=2)
    return _run(traces, max_draft, lambda: _ChainOracle(n))


def copy_speedup_bound(traces, cost, *, frequent: int = 0, max_draft: int = 64) -> dict[str, float]:
    """Decode speedup over one-token steps (all tokens over all time, per dataset) of the best drafter
    of copy_bound's family (with `frequent` > 0, copy_or_frequent_bound's with k = frequent), where
    a verify of n nodes takes cost.seconds(n) (`cost`: a CostModel, a built-in table's name or a
    table "nodes:ms,..."; module docstring)."""
    traces = list(traces)
    cost = CostModel.named(cost)
    totals: dict[str, list[float]] = {}
    for trace, (plain, best) in zip(traces, copy_decode_seconds(traces, [cost] * len(traces),
                                                                frequent=frequent, max_draft=max_draft)):
        total = totals.setdefault(trace.dataset, [0.0, 0.0])
        total[0] += plain
        total[1] += best
    return {dataset: plain / best for dataset, (plain, best) in totals.items()}


def copy_decode_seconds(traces, costs, *, frequent: int = 0, max_draft: int = 64) -> list[tuple[float, float]]:
    """Per trace, (seconds of one-token steps, seconds of the fastest decode by the best drafter of
    copy_speedup_bound's family), trace i's verify of n nodes taking costs[i].seconds(n): each
    request may run at its own context, so at its own costs (benchmarks/end_to_end_bound.py measures
    them per request). Later traces see the earlier ones, as in every bound here."""
    traces, max_draft = _checked(traces, max_draft)
    frequent = positive_int("frequent", frequent, minimum=0)
    costs = [CostModel.named(cost) for cost in costs]
    if len(costs) != len(traces):
        raise InputError(f"costs: expected one per trace ({len(traces)}), got {len(costs)}")
    oracle = _CopyOracle(1, frequent)
    priced: dict[int, tuple[np.ndarray, np.ndarray]] = {}   # id(cost) -> (seconds, fastest): each table once
    results = []
    for trace, cost in zip(traces, costs):
        if id(cost) not in priced:
            # A forward of n nodes may carry more nodes where more cost less (a CPU's GEMM against its GEMV).
            seconds = np.array([cost.seconds(n) for n in range(1, max_draft + 2)])
            # fastest[d]: a root and d drafted tokens
            priced[id(cost)] = seconds, np.minimum.accumulate(seconds[::-1])[::-1]
        seconds, fastest = priced[id(cost)]
        prompt, output = [int(t) for t in trace.prompt_ids], [int(t) for t in trace.output_ids]
        oracle.start(prompt)
        longest = []   # longest[p]: the most tokens a step at output position p can draft and have accepted
        for position in range(len(output)):
            longest.append(oracle.draft(output, position, min(max_draft, len(output) - 1 - position)))
            oracle.accept(output[position:position + 1])
        oracle.finish()
        results.append((len(output) * float(seconds[0]), _fastest_decode(longest, fastest)))
    return results


def _fastest_decode(longest: list[int], fastest: np.ndarray) -> float:
    """Seconds of the fastest decode of an output whose step at position p may draft up to
    longest[p] tokens: time[p] = min over d of fastest[d] + time[p + d + 1]."""
    time = np.zeros(len(longest) + 1)
    for position in range(len(longest) - 1, -1, -1):
        reach = longest[position] + 1
        time[position] = np.min(fastest[:reach] + time[position + 1:position + 1 + reach])
    return float(time[0])


def _checked(traces, max_draft):
    traces = list(traces)
    if not traces:
        raise InputError("traces: expected at least one Trace, got none")
    max_draft = positive_int("max_draft", max_draft, minimum=0)
    for trace in traces:
        for name, ids in (("prompt_ids", trace.prompt_ids), ("output_ids", trace.output_ids)):
            if len(ids) and not 0 <= int(min(ids)) <= int(max(ids)) < _TOKEN_LIMIT:
                raise InputError(f"traces: {trace.dataset}/{trace.idx} {name} holds ids in [{int(min(ids))}, "
                                 f"{int(max(ids))}], expected ids in [0, {_TOKEN_LIMIT})")
    return traces, max_draft


def _run(traces, max_draft, make_oracle) -> dict[str, float]:
    traces, max_draft = _checked(traces, max_draft)
    oracle = make_oracle()   # one for all traces: later traces see the earlier ones
    totals: dict[str, list[int]] = {}
    for trace in traces:
        prompt, output = [int(t) for t in trace.prompt_ids], [int(t) for t in trace.output_ids]
        oracle.start(prompt)
        position, steps = 0, 0
        while position < len(output):
            # A step emits its accepted draft and one token of the model's, never past the output.
            longest = min(max_draft, len(output) - 1 - position)
            drafted = oracle.draft(output, position, longest)
            oracle.accept(output[position:position + drafted + 1])
            position += drafted + 1
            steps += 1
        oracle.finish()
        total = totals.setdefault(trace.dataset, [0, 0])
        total[0] += len(output)
        total[1] += steps
    return {dataset: tokens / steps for dataset, (tokens, steps) in totals.items()}


_TOKEN_LIMIT = 0x10FFFF - 0x100   # ids a character can hold, above the separator's range


def _text(tokens) -> str:
    # Token ids as characters, so str.find does the substring search.
    return "".join(chr(0x100 + t) for t in tokens)


class _CopyOracle:
    _SEPARATOR = "\x00"   # between traces: no copy runs from one trace into the next

    def __init__(self, context: int, frequent: int):
        self.context, self.frequent = context, frequent
        self._done = ""          # the earlier traces, separated
        self._current = ""       # this trace's prompt and output so far
        self._counts: Counter = Counter()

    def start(self, prompt) -> None:
        self._current = _text(prompt)
        self._counts.update(prompt)

    def draft(self, output, position: int, longest: int) -> int:
        seen = self._done + self._current
        suffix = self._current[-self.context:]
        future = _text(output[position:position + longest])
        drafted = 0
        while drafted < longest and seen.find(suffix + future[:drafted + 1]) >= 0:
            drafted += 1
        if drafted == 0 and longest > 0 and self.frequent and \
                output[position] in {token for token, _ in self._counts.most_common(self.frequent)}:
            drafted = 1
        return drafted

    def accept(self, tokens) -> None:
        self._current += _text(tokens)
        self._counts.update(tokens)

    def finish(self) -> None:
        self._done += self._current + self._SEPARATOR
        self._current = ""


class _ChainOracle:
    def __init__(self, n: int):
        self.n = n
        self._grams: set[tuple[int, ...]] = set()
        self._current: list[int] = []

    def start(self, prompt) -> None:
        self._current = []
        self.accept(prompt)

    def draft(self, output, position: int, longest: int) -> int:
        text = self._current + list(output[position:position + longest])
        start, n, drafted = len(self._current), self.n, 0
        while drafted < longest and start + drafted >= n - 1 and \
                tuple(text[start + drafted - n + 1:start + drafted + 1]) in self._grams:
            drafted += 1
        return drafted

    def accept(self, tokens) -> None:
        first = len(self._current)
        self._current.extend(tokens)
        for end in range(max(first, self.n - 1), len(self._current)):
            self._grams.add(tuple(self._current[end - self.n + 1:end + 1]))

    def finish(self) -> None:
        self._current = []
