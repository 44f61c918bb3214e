"""The auto budget: each step, the draft size with the best expected tokens per second.

    value(k) = (1 + bias * gamble * expected accepted tokens of the best k candidates)
               / cost(k candidates + the root + the tree's lookahead nodes)

over the menu sizes, "no draft" (k = 0) included, each factor learnt by its own part while it runs
(docs/budget.md: the measurement behind each rule):

    costs.py        CostTable      seconds per menu size and window size; guesses for sizes never measured
    contexts.py     ContextCosts   one CostTable per bucket of context length, each leaning on the nearest
    explore.py      Explorer       now and then a neighbouring size instead of the best
    calibration.py  Calibration    acceptance per (score bin, rank bucket), from every proposed candidate
    corrections.py  Correction     bias and gamble: what the expectation is worth on what it picks
    pausing.py      PauseTrials    whether drafting pays at all: the draft and pause arms
    idle.py         IdleSkipping   skip asking a drafter that keeps drafting nothing, where asking costs
    aftermath.py    Aftermath      a drafted step's cost includes what it leaves for the next step
    floor.py        FloorGuard     a request verifies only the trees whose worst case its slack affords
    lookahead.py    Windows        whether a lookahead window rides along: its probe, experiments, charge
    constants.py                   the fixed numbers, each with the measurement it comes from
    kernels.py                     the numba kernels (the floor's one cut: kernels.affords)
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ConfigError, InputError
from ..jit import kernels
from ..tree import DraftTree
from ..validate import cost_or_inf, positive_float, positive_int, tree_size
from .aftermath import Aftermath
from .calibration import Calibration
from .constants import BIAS_FLOOR, BIAS_PRIOR, CORRECTION_MEMORY, GAMBLE_FLOOR, GAMBLE_PRIOR
from .corrections import Correction
from .contexts import ContextCosts
from .explore import HOPELESS, Explorer
from .floor import FloorGuard
from .idle import IdleSkipping
from .lookahead import Windows
from .pausing import PauseTrials


class CostAwareBudget:
    """The draft size with the best expected tokens per second, "no draft" included; a
    `BudgetPolicy` (draftcore.protocols). Keep one per deployment: what it learns carries over.

        parameter        default  meaning
        max_nodes        64       most drafted candidates ever verified (at most what one verify can
                                  hold on this machine: validate.max_tree_nodes)
        smoothing        0.2      weight of a new cost measurement in its size's average
        optimism         0.05     unmeasured size's guessed cost growth per node, relative to 1 node
        explore_every    16       steps before a neighbouring size is re-measured; also between
                                  windows asked for once one is dropped (LookaheadProbe)
        explore_backoff  2        factor on that interval while the choice stays the same (1: fixed);
                                  also on the interval between pause trials while the winner stays
        memory           6000     steps after which acceptance evidence has faded to 1/e (None: never)
        window_cost      0.1      a lookahead window rides along only while it adds at most this
                                  share to a step's cost (inf: always)
        trial_every      64       steps between trials of the arm not in use: drafting or pausing;
                                  also from a dropped window to a step it rides anyway (re-measured)
        idle_skip        3        most steps skipped after proposals in a row that drafted nothing
                                  (0: only a hopeless proposal skips one)
        idle_cost        0.02     skip those only while asking the drafter costs more than this
                                  share of a root-only step
        trial_steps      16       steps a trial of drafting lasts (a trial of pausing: 4; 0: never pause)
        max_loss         0.02     share of a request's plain decoding time its drafting may lose,
                                  beyond one root-only step: a tree is verified only if, accepting
                                  nothing, it keeps the request within that (floor.py; inf: no limit)
    """

    def __init__(self, max_nodes: int = 64, smoothing: float = 0.2, optimism: float = 0.05,
                 explore_every: int = 16, explore_backoff: int = 2, memory: float | None = 6000.0,
                 window_cost: float = 0.1, trial_every: int = 64, trial_steps: int = 16, idle_skip: int = 3,
                 idle_cost: float = 0.02, max_loss: float = 0.02):
        # more nodes than one verify can hold is refused (validate.max_tree_nodes), not allocated for
        self.max_nodes = tree_size("max_nodes", max_nodes, minimum=1)
        self.smoothing = positive_float("smoothing", smoothing)
        if self.smoothing > 1.0:
            raise ConfigError(f"smoothing: expected a number in (0, 1], got {smoothing}")
        self.optimism = positive_float("optimism", optimism, inclusive=True)
        self.explore_every = positive_int("explore_every", explore_every)
        self.explore_backoff = positive_int("explore_backoff", explore_backoff)
        self.memory = None if memory is None else positive_float("memory", memory, minimum=1.0, inclusive=True)
        self.window_cost = cost_or_inf("window_cost", window_cost)
        self.trial_every = positive_int("trial_every", trial_every)
        self.trial_steps = positive_int("trial_steps", trial_steps, minimum=0)
        self.idle_skip = positive_int("idle_skip", idle_skip, minimum=0)
        self.idle_cost = positive_float("idle_cost", idle_cost, minimum=0.0, inclusive=True)
        self.max_loss = cost_or_inf("max_loss", max_loss)
        self._step = 0   # steps observed
        self._contexts = ContextCosts(self.max_nodes + 1, self.smoothing, self.optimism)
        self.sizes = self._costs.sizes   # candidate-tree sizes (nodes, root included)
        self._explore = Explorer(self.explore_every, self.explore_backoff)
        self._calibration = Calibration(self.max_nodes, self.memory)
        # the bias: on the prefixes it verified or would have; the gamble: on the trees it verified
        self._bias = Correction(CORRECTION_MEMORY, BIAS_PRIOR, BIAS_FLOOR)
        self._gamble = Correction(CORRECTION_MEMORY, GAMBLE_PRIOR, GAMBLE_FLOOR)
        self._sees_outcomes = False   # the loop reports outcomes (speculate does; a draft model does not)
        self._trials = PauseTrials(self.trial_every, self.trial_steps, self.explore_backoff)
        self._skipping = IdleSkipping(self.idle_skip, self.idle_cost)
        self._windows = Windows(self.window_cost, self.explore_every, self.trial_every, self.explore_backoff)
        self._aftermath = Aftermath()
        self._guard = FloorGuard(self.max_loss)
        self._next_n_past = -1   # the context the next step of the same sequence starts from
        self._kernels = kernels("draftcore.budget.kernels")

    @property
    def _costs(self):
        return self._contexts.current

    # -- the policy ---------------------------------------------------------------------------
    def at_context(self, n_past: int) -> None:
        """The next step verifies after `n_past` cached tokens (its costs: that context's bucket)."""
        # every step: a plain type test, not the validators; a bad count would misfile costs for good
        if not isinstance(n_past, (int, np.integer)) or isinstance(n_past, bool) or n_past < 0:
            raise InputError(f"n_past: expected the number of cached tokens, an int >= 0, got {n_past!r}")
        if n_past != self._next_n_past:   # another sequence: nothing of the last one follows its last step
            self._learn_costs(self._aftermath.flush())
            self._guard.new_request()
        self._contexts.at(n_past)
        self._next_n_past = int(n_past)

    def request_size(self) -> int:
        self._skipping.asked = False
        drafting = self._trials.start_step(self._step)
        if drafting and (self._skipping.skip() or not self._affords_a_tree()):
            return 0
        return self.max_nodes if drafting else 0

    def _affords_a_tree(self) -> bool:
        """Whether the floor guard affords any reachable drafted tree; where not, the drafter is not
        asked (on llama.cpp CPU asking cost ~0.4 ms of a 15-20 ms step: "The floor per request")."""
        if not self._costs.root_measured(0):
            return True
        estimates = self._costs.estimated(0)
        if not estimates[0] > 0:   # a clock that never advanced prices nothing
            return True
        # every size a tree may reach, not only 2 nodes: a step's cost need not grow with its size
        reach = self._costs.reachable()
        return bool(self._guard.affordable(estimates[:reach] / estimates[0])[1:].any())

    def choose(self, tree: DraftTree) -> int:
        self._skipping.asked = True
        n_draft = min(tree.n_draft, self.max_nodes)
        if n_draft == 0:
            return self._skipping.after_choice(0, False)
        if not self._costs.root_measured(tree.n_lookahead):
            return 0  # first measure what a step without candidates costs
        # One kernel: each menu size's expected tokens per second, its window priced in, 0 where the
        # floor guard does not afford it; `hopeless` skips asking the drafter next step (idle.py).
        value, best, hopeless = self._kernels.menu_values(
            self._calibration.probabilities(tree, n_draft + 1), tree.parents, n_draft + 1, self.sizes,
            self._costs.menu_entries(n_draft + 1), self._costs.estimated(tree.n_lookahead),
            self.bias() * self.gamble_correction(), self._guard.slack, self._guard.max_loss, HOPELESS)
        best = self._explore.pick(self._step, best, value)
        return self._skipping.after_choice(int(self.sizes[best]) - 1, hopeless)

    def keep_lookahead(self, tree: DraftTree, n_draft: int) -> bool:
        """Whether the tree's lookahead window rides along (draftcore.budget.lookahead.Windows)."""
        return self._windows.keep(self._costs, tree.n_lookahead, n_draft, self._step, self._guard, self._aftermath)

    def wants_lookahead(self) -> bool:
        """Whether to build a lookahead window this step (`LookaheadProbe`)."""
        return self._windows.wants()

    def observe(self, tree: DraftTree, path: np.ndarray, seconds: float) -> None:
        # NaN or a negative time too: one bad time would steer every later choice
        if not isinstance(seconds, (int, float, np.number)) or not 0 <= seconds < math.inf:
            raise InputError(f"seconds: expected the step's finite duration >= 0, got {seconds!r}")
        self._step += 1
        if self._next_n_past >= 0:
            self._next_n_past += path.shape[0]
        if tree.n_candidates == 1 and not tree.n_lookahead and self._aftermath.pending is None:
            self._skipping.learn_root_seconds(seconds)   # a root-only step after another: no aftermath in it
        # The arms compare tokens per root-only step at the step's own context, not per second: a
        # pause trial late in a long request must not lose to drafting steps measured early in it.
        # A clock that never advanced prices nothing: each step counts as one root-only step.
        unit = self._contexts.unit()
        drafting = self._trials.end_step(self._step, path.shape[0], seconds / unit if unit > 0 else 1.0)
        # a window's first step or trial is charged whole by the window part, against its price at the worst
        if not self._windows.charge(tree, path, seconds, self._guard) and \
                (without_candidates := self._costs.root_estimate(tree.n_lookahead)) > 0:
            self._guard.learn(path.shape[0], seconds / without_candidates,
                              self._costs.cost(tree.n_candidates, tree.n_lookahead) / without_candidates
                              if tree.n_candidates > 1 else None)
        # a paused step teaches no cost of its own, but shows what the drafted step before it left
        self._learn_costs(self._aftermath.settle(self._costs, tree.n_candidates, tree.n_lookahead, seconds,
                                                 teaches=drafting))
        if not drafting:
            return   # a paused step: no acceptance either
        self._costs.tried(tree.n_candidates)
        accepted = path.shape[0] - 1.0
        if tree.n_draft and self._sees_outcomes:
            # Only where the loop reports outcomes: learnt from verified trees alone, a correction
            # could fall and never see the trees it stopped verifying come true.
            expected = float(self._calibration.expected_accepted(tree, tree.n_candidates)[-1])
            self._gamble.learn(expected * self.bias(), accepted)
            self._bias.learn(expected, accepted)
        self._calibration.learn_verified(tree, path)

    @staticmethod
    def _learn_costs(measurements) -> None:
        for table, n_candidates, n_lookahead, seconds in measurements:
            table.learn(n_candidates, n_lookahead, seconds)

    def observe_outcomes(self, tree: DraftTree, verified: int, outcome: np.ndarray) -> None:
        """What the emitted tokens showed of a whole proposal (draftcore.outcomes): `outcome` per
        node, 1 accepted, 0 not, -1 unknown. The unverified candidates join the calibration, and the
        prefix `choose` would pick uncorrected, where longer than what was verified, teaches the bias."""
        self._sees_outcomes = True
        if tree.n_candidates <= 1:
            return
        sizes = self.sizes if self._costs.root_measured(0) else self.sizes[:0]
        expected, accepted = self._calibration.learn_outcomes(tree, verified, outcome, sizes,
                                                              self._costs.estimated(0))
        if expected >= 0.0:   # the prefix it would pick uncorrected, longer than what was verified
            self._bias.learn(expected, accepted)

    # -- what it has learnt (also for reports) -------------------------------------------------
    @property
    def drafting_pays(self) -> bool:
        """Whether drafting is the better arm now (False: it drafts only in trials)."""
        return self._trials.drafting_pays()

    def arm_rates(self) -> tuple[float, float]:
        """Recent tokens per root-only step of the (draft, pause) arms; NaN for an arm never run."""
        return self._trials.rates()

    def costs_by_context(self) -> dict[str, list[float]]:
        """Measured seconds per menu size (NaN: never), without windows, per context bucket."""
        return self._contexts.by_bucket()

    def asking_costs(self) -> bool:
        """Whether asking the drafter costs over `idle_cost` of a root-only step (idle.py)."""
        return self._skipping.asking_costs()

    def bias(self) -> float:
        """Recent accepted over expected tokens of the prefixes it verified or would have, in
        [BIAS_FLOOR, 1]; 1 for a caller that reports no outcomes (corrections.py)."""
        return self._bias.value()

    def gamble_correction(self) -> float:
        """Recent accepted over bias-corrected expected tokens of the trees it verified, in
        [GAMBLE_FLOOR, 1]; 1 for a caller that reports no outcomes (corrections.py)."""
        return self._gamble.value()

    def cost(self, n_nodes, n_lookahead: int = 0) -> np.ndarray:
        """Estimated seconds of a step (CostTable.cost)."""
        return self._costs.cost(n_nodes, n_lookahead)

    def acceptance_by_score(self) -> np.ndarray:
        """Calibrated acceptance per score bin (rows) and rank bucket (for reports)."""
        return self._calibration.accepted / self._calibration.offered
