"""Sampling options for `speculate`, and the acceptance rules the decode loop is parameterised by.

    draftcore.speculate(verifier, prompt, sampling=dict(temperature=0.7, top_p=0.9, seed=0))

Names and meanings follow transformers' `generate` (plus presence / frequency penalties as in the
OpenAI API and vLLM); see `draftcore.processors` for the exact semantics and order. Speculative
sampling is exact: every generated sequence has the probability plain sampling gives it.

A rule tells the loop how many leading rows of logits to ask the verifier for (`n_logits`; the
verifier always returns every node's argmax) and turns the answer into tokens; the loop itself is
the same for all of them:

    rule              n_logits            first token                 a verified tree
    GreedyRule        0                   the prefill's argmax        greedy_accept(argmax per node)
    ProcessedRule     the candidates      argmax or keyed draw from   greedy: process every candidate row for its
                                          the processed prefill row   node's prefix, greedy_accept; sampling: the
                                                                      keyed walk (acceptance.sample_step),
                                                                      processing only the rows it reaches

Lookahead nodes never need logits: acceptance does not walk them, and a drafter observes the
model's argmax there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from .errors import BackendError, ConfigError, describe
from .jit import kernels
from .validate import flag


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each token; the defaults are plain sampling from the model's distribution.

        parameter           default  meaning (transformers' name and semantics)
        do_sample           True     False: greedy (argmax after the penalties), like transformers
        temperature         1.0      logits / temperature; 0 means greedy
        top_k               None     keep the k most likely tokens (None or 0: off). transformers'
                                     GenerationConfig defaults to 50; draftcore applies no top-k
                                     unless asked (pass top_k=50 for transformers' default behaviour)
        top_p               1.0      nucleus: the most likely tokens up to mass top_p (1.0: off)
        min_p               None     drop tokens below min_p · max probability (None or 0: off)
        repetition_penalty  1.0      divide positive / multiply negative logits of every token in
                                     prompt + generated (also applies when greedy)
        presence_penalty    0.0      subtract from every token generated at least once (OpenAI/vLLM)
        frequency_penalty   0.0      subtract times the number of times it was generated (OpenAI/vLLM)
        seed                None     int: reproducible; a numpy Generator: drawn from (and advanced);
                                     None: fresh entropy, reported as `result.seed` for replay
        logits_processors   ()       callables fn(prefix, logits) -> logits (a float32 or float64
                                     numpy row of one score per token; anything else is refused),
                                     each a pure function of the prefix (int64 ids: prompt +
                                     generated) and the float32 row,
                                     applied in order after the penalties and before temperature
                                     (transformers' place for a user LogitsProcessor); draftcore
                                     calls them once per drafted node with that node's own prefix,
                                     so a processor that keeps state between calls is not exact

    A seed replays a run: the token at each output position is drawn with that position's own
    uniform (draftcore.acceptance), so the output depends on the seed, the model and these options
    alone, not on the drafter, the budget or what either has learnt; budget=0 (no draft) gives the
    same tokens. (As with greedy near-ties, a draw sits within the logits' rounding of a boundary
    between two tokens with probability about that rounding, and may then move.)
    """

    do_sample: bool = True
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | np.random.Generator | None = None
    logits_processors: tuple = ()

    def __post_init__(self):
        flag("do_sample", self.do_sample)
        temperature = 1.0 if self.temperature is None else self.temperature  # transformers: None = 1.0
        object.__setattr__(self, "temperature", _number("temperature", temperature, 0.0, math.inf,
                                                        "a finite number >= 0 (0: greedy)"))
        if self.top_k is not None:
            if isinstance(self.top_k, bool) or not isinstance(self.top_k, (int, np.integer)) or self.top_k < 0:
                raise ConfigError(f"top_k: expected None or an int >= 0 (0: off), got {describe(self.top_k)}")
            object.__setattr__(self, "top_k", int(self.top_k))
        top_p = 1.0 if self.top_p is None else self.top_p
        object.__setattr__(self, "top_p", _number("top_p", top_p, 0.0, 1.0, "a number in [0, 1] (1: off)"))
        if self.min_p is not None:
            object.__setattr__(self, "min_p", _number("min_p", self.min_p, 0.0, 1.0,
                                                      "None or a number in [0, 1] (0: off)"))
        penalty = 1.0 if self.repetition_penalty is None else self.repetition_penalty
        object.__setattr__(self, "repetition_penalty", _number("repetition_penalty", penalty, 0.0, math.inf,
                                                               "a finite number > 0 (1: off)", open_low=True))
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            value = 0.0 if value is None else value
            object.__setattr__(self, name, _number(name, value, -math.inf, math.inf, "a finite number (0: off)"))
        seed = self.seed
        if not (seed is None or isinstance(seed, np.random.Generator)
                or (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0)):
            raise ConfigError(f"seed: expected None, an int >= 0 or a numpy Generator, got {describe(seed)}")
        processors = self.logits_processors
        if processors is None or callable(processors) or isinstance(processors, (str, bytes)):
            raise ConfigError(f"logits_processors: expected a sequence of callables fn(prefix, logits), "
                              f"got {describe(processors)}")
        processors = tuple(processors)
        for i, fn in enumerate(processors):
            if not callable(fn):
                raise ConfigError(f"logits_processors[{i}]: expected a callable fn(prefix, logits) -> logits, "
                                  f"got {describe(fn)}")
        object.__setattr__(self, "logits_processors", processors)

    @property
    def is_greedy(self) -> bool:
        """do_sample=False or temperature 0: argmax of the penalised logits."""
        return not self.do_sample or self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def processed(self) -> bool:
        """Greedy needs the logits too: something changes them before the argmax."""
        return self.penalised or bool(self.logits_processors)

    def key(self) -> tuple[np.uint64, int | None]:
        """(the 64-bit key of one request's draws, the int seed that replays it, or None): from an
        int seed through numpy's SeedSequence (nearby seeds give unrelated keys); from a Generator,
        its next 64 random bits (so it advances); from None, fresh entropy, reported as the seed."""
        if isinstance(self.seed, np.random.Generator):
            return np.uint64(self.seed.bit_generator.random_raw()), None
        seed = self.seed if self.seed is not None else int(np.random.SeedSequence().entropy % (1 << 63))
        return np.random.SeedSequence(seed).generate_state(1, np.uint64)[0], int(seed)


FIELDS = tuple(f.name for f in fields(SamplingParams))


def as_sampling_params(sampling) -> SamplingParams | None:
    """`speculate(sampling=...)`: None (greedy), a SamplingParams, or a dict of its fields."""
    if sampling is None or isinstance(sampling, SamplingParams):
        return sampling
    if isinstance(sampling, dict):
        unknown = sorted(set(sampling) - set(FIELDS), key=str)
        if unknown:
            raise ConfigError(f"sampling: unknown option(s) {unknown}; expected some of {list(FIELDS)}")
        return SamplingParams(**sampling)
    raise ConfigError(f"sampling: expected None (greedy), a SamplingParams or a dict of its fields, "
                      f"got {describe(sampling)}")


def _number(name, value, low, high, expected, open_low=False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{name}: expected {expected}, got {describe(value)}")
    value = float(value)
    if not math.isfinite(value) or value < low or value > high or (open_low and value == low):
        raise ConfigError(f"{name}: expected {expected}, got {value}")
    # the logits are float32: a value that is 0 or subnormal there divides them into inf or NaN
    if value != 0 and not _FLOAT32_TINY <= abs(value) <= _FLOAT32_MAX:
        raise ConfigError(f"{name}: expected {expected}, with a float32 magnitude in [{_FLOAT32_TINY:.4g}, "
                          f"{_FLOAT32_MAX:.4g}] where nonzero (the logits are float32), got {value}")
    return value


_FLOAT32_TINY, _FLOAT32_MAX = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)


# -- acceptance rules: what the decode loop asks for and how it turns the answer into tokens ------------
def make_rule(params: SamplingParams | None, vocab_size: int):
    """The rule for `speculate(sampling=params)`: the backend's argmax when nothing needs logits."""
    if params is None or (params.is_greedy and not params.processed):
        return GreedyRule(vocab_size)
    return ProcessedRule(params, vocab_size)


class GreedyRule:
    """Plain greedy: the backend computes the argmax where the logits live (no logits copied)."""

    seed = None
    prefill_logits = 0

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self._accept = kernels("draftcore.acceptance").greedy_accept

    def start(self, prompt: np.ndarray) -> None:
        pass

    def update(self, tokens: np.ndarray) -> None:
        pass

    def n_logits(self, tree) -> int:
        return 0

    def first(self, tokens, logits) -> int:
        return int(tokens[0])

    def accept(self, tree, tokens, logits) -> tuple[np.ndarray, int]:
        if tree.tokens.shape[0] == 1:   # a root-only step (no draft, a pause): no walk to take
            return _checked_walk(np.zeros(1, np.int32), tokens[0], tree)
        return _checked_walk(*self._accept(tree.tokens, tree.parents, tokens, tree.n_candidates), tree)


class ProcessedRule:
    """Logits processed for every node's own prefix, then argmax (greedy with penalties) or the keyed
    sampling walk (`acceptance.sample_step` from the root down; the token at output position t is
    drawn with the uniform of position t under the request's key, so a seed replays the output
    whatever was drafted)."""

    prefill_logits = 1

    def __init__(self, params: SamplingParams, vocab_size: int):
        processors = kernels("draftcore.processors")
        acceptance = kernels("draftcore.acceptance")
        self._greedy_accept = acceptance.greedy_accept
        self._sample_step, self._uniforms = acceptance.sample_step, acceptance.position_uniforms
        self.vocab_size = vocab_size
        self.sample = not params.is_greedy
        self.processor = processors.LogitsProcessor.from_params(params, vocab_size)
        self.key, self.seed = params.key() if self.sample else (None, None)
        self.n_generated = 0   # the output position the tree's root predicts

    def start(self, prompt: np.ndarray) -> None:
        self.processor.start(prompt)

    def update(self, tokens: np.ndarray) -> None:
        self.processor.update(tokens)
        self.n_generated += tokens.shape[0]

    def n_logits(self, tree) -> int:
        return tree.n_candidates

    def first(self, tokens, logits) -> int:
        if not self.sample:
            return int(np.argmax(self.processor.process_next(logits[0])))
        p = self.processor.probs_node(logits[0], _ROOT, _ROOT_PARENT, 0)
        return int(self._sample_step(_ROOT, _ROOT_PARENT, 1, 0, p, self._uniforms(self.key, 0, 1)[0])[1])

    def accept(self, tree, tokens, logits) -> tuple[np.ndarray, int]:
        n_walk = tree.n_candidates
        if not self.sample:
            z = self.processor.process_tree(logits, tree.tokens, tree.parents)
            return self._greedy_accept(tree.tokens, tree.parents, z.argmax(axis=1).astype(np.int32), n_walk)
        # The walk, node by node: only the reached nodes are processed. A path of depth d needs
        # the uniforms of the next d + 1 positions.
        uniforms = self._uniforms(self.key, self.n_generated, int(tree.depths[:n_walk].max()) + 1)
        path = [0]
        while True:
            p = self.processor.probs_node(logits, tree.tokens, tree.parents, path[-1])
            child, token = self._sample_step(tree.tokens, tree.parents, n_walk, path[-1], p,
                                             uniforms[len(path) - 1])
            if child < 0:
                return np.array(path, np.int32), int(token)
            path.append(int(child))


def _checked_walk(path, next_token, tree):
    if next_token < 0:  # the walk reached a node the backend reported as not evaluated
        raise BackendError(f"verifier.verify: node {int(path[-1])} is on the accepted path, but its token was "
                           f"reported missing (-1); a verifier must evaluate every node greedy acceptance reaches")
    return path, int(next_token)


_ROOT = np.zeros(1, np.int32)
_ROOT_PARENT = np.full(1, -1, np.int32)
