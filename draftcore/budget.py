"""How many draft nodes to verify per step.

On a GPU a verify of 64 tokens costs about as much as one; on a CPU it does not (SmolLM2 Q4_1 on
llama.cpp, 2 cores, a whole verify: 1 token 4.8 ms, 2 → 11.7, 8 → 27.2). So the size of the tree
to verify must follow what verifying costs on this machine and how likely the draft is to be
accepted.

A budget policy has three methods, called by `speculate` once per step:
    request_size() -> int          how many candidate nodes to ask the drafter for
    choose(tree) -> int            how many candidates to verify: a best-first prefix of the tree's
                                   candidates; a tree's lookahead nodes (a Jacobi window) are
                                   verified whole or not at all, and priced with the candidates
    observe(tree, path, seconds)   the step that verified `tree` (drafting, verify, commit) took
                                   `seconds`; `path` was accepted
and optionally
    keep_lookahead(tree, k) -> bool  whether the tree's lookahead window rides along with its first
                                   k candidates (default: always, as FixedBudget does)
    wants_lookahead() -> bool      asked before proposing, of a drafter that can leave its window
                                   out (`DraftRequest.lookahead_optional`): whether to build one this
                                   step at all (default: always). `LookaheadProbe` answers it from
                                   what keep_lookahead last decided.
    observe_outcomes(tree, verified, outcome)  what every node of a step's proposal would have
                                   done, a few tokens later (draftcore.outcomes; verified or not)

`FixedBudget` verifies the drafter's best n nodes every step. `CostAwareBudget` measures the
verifier's cost per tree size while it runs and picks the size that maximises expected tokens per
second, including "no draft"; keep one object per deployment so what it learns carries over.
"""
from __future__ import annotations

import math

import numpy as np

from .errors import ConfigError, InputError
from .jit import kernels
from .tree import DraftTree
from .validate import positive_float, positive_int, tree_size


class FixedBudget:
    """Verify up to `n` drafted nodes every step (the paper's decoding_length)."""

    concurrent_requests = True  # no state: any number of requests may share one

    def __init__(self, n: int):
        # Asked of the drafter every step: more than one verify can hold is refused (validate.max_tree_nodes).
        self.n = tree_size("budget", n, minimum=0)

    def request_size(self) -> int:
        self._asked = False
        return self.n

    def choose(self, tree: DraftTree) -> int:
        return min(self.n, tree.n_draft)  # the tree's lookahead nodes are kept whole by the loop

    def observe(self, tree: DraftTree, path: np.ndarray, seconds: float) -> None:
        pass


class LookaheadProbe:
    """Whether a drafter should build its lookahead window this step, from what the policy last
    decided about one: every step while windows are kept (or none was offered yet); once one is
    dropped, only every `every`-th step, so a window that would pay again is noticed without
    building one every step only to drop it (on a CPU a Jacobi window cost ~20 us a step there).

        probe = LookaheadProbe()
        probe.wants()          # before proposing: build a window?
        probe.decided(kept)    # the policy's keep_lookahead verdict on one; returns `kept`
    """

    def __init__(self, every: int = 16):
        self.every = positive_int("every", every)
        self._kept: bool | None = None   # the last verdict; None: no window judged yet
        self._since = 0                   # proposals without a window since the last one offered

    def wants(self) -> bool:
        if self._kept is not False:
            return True
        self._since += 1
        if self._since >= self.every:
            self._since = 0
            return True
        return False

    def decided(self, kept: bool) -> bool:
        self._kept, self._since = bool(kept), 0
        return bool(kept)


class CostAwareBudget:
    """Pick the draft size k that maximises (1 + expected accepted tokens) / cost(tree of k drafted
    candidates plus the tree's lookahead nodes).

    Cost: an exponential moving average of step seconds (drafting + verify + commit) for each size on
    a menu of candidate counts (1 to 6, then 8, 12, 16, 24, 32, 48, 64, ... and max_nodes + 1 nodes,
    the root included), one menu per number of lookahead nodes, each size measured on its own,
    because the cost is not monotonic: on a CPU a 3-token forward can cost more than a 4-token one,
    a 2-token one less than a 1-token one (matrix-kernel choice; HFVerifier, SmolLM2 fp32 on 2
    cores: 1 → 46 ms, 2 → 44, 3 → 57, 4 → 55, 6 → 73, 8 → 78, 16 → 99). Only menu sizes are verified.
    A step slower than twice its size's estimate counts as twice it (one page fault must not make
    no draft look dearer than a draft). A size never measured is guessed optimistically from the cheapest measured step, so bigger trees
    get tried, measured and then kept or dropped; but where two smaller sizes are measured, never
    below the largest of them plus half the cost growth per node measured up to it (on a CPU a
    verify's cost grows with its nodes, and a guess far below that tried every large size once).
    Acceptance: the drafter's score of each candidate (its estimate that the node's path is accepted)
    is calibrated against what was really accepted, per score bin and rank in the best-first order
    (1, 2–3, 4–7, 8–15, 16–31, 32+): a trie's first node is accepted far more often than a later
    node of the same score (when this was introduced, replayed SmolLM2 outputs gave a simulated
    HumanEval speedup of 1.85x with rank buckets, 1.61x without). Every proposed candidate counts,
    verified or not: the tokens emitted a few steps later show whether an unverified one would have
    been accepted (`observe_outcomes`, draftcore.outcomes), so the calibration does not rest on the
    few candidates a CPU budget verifies, chosen where it was most optimistic. The expected number of
    accepted drafted tokens of a best-first prefix of k candidates is the sum of their calibrated
    probabilities made consistent with the tree (children share at most their parent's probability;
    two siblings calibrated at 0.8 each do not make 1.6 tokens), times a bias correction: recent
    accepted over expected tokens of the prefix it verified, or would have verified without the
    correction, learnt from every proposal's outcome (memory 32 proposals, in [0.25, 1]; 1 where the
    caller reports no outcomes). On llama.cpp (a CPU, where 2
    tokens cost twice 1) the composite's verified trees accepted 566 tokens where the summed
    calibration expected 799 (the consistent sum: 646). On top of that, a gamble correction: recent
    accepted over (bias-corrected) expected tokens of the trees it verified (memory 32 trees, prior
    12 tokens, in [0.6, 1]; `gamble_correction`), because the trees it verifies are those whose
    estimates looked best, and those err high more than the average proposal's: replayed on the
    llama.cpp table, it took the composite from 0.97x / 0.97x to 1.00x / 0.99x of plain decoding
    (HumanEval, median / all tokens, 12 orders) and the trie from 1.00x / 0.99x to 1.00x / 1.01x, HF
    CPU within 0.5 % either way. Lookahead nodes are never accepted, so they
    are priced but never calibrated. A proposal whose best draft is worth less than half of no draft
    skips the next proposal (that step verifies the root alone), and where asking costs, proposals
    in a row that draft nothing skip more: after the k-th, the next min(k - 1, `idle_skip`) steps
    ask for none. Drafting is not free where a step is a few milliseconds: on llama.cpp (SmolLM2
    Q4_1, 2 CPU cores, 6.5 ms a step) the trie's proposal, the choice and the outcome bookkeeping
    took ~0.25 ms a step, while its budget chose no draft on 9 steps in 10. What asking costs is
    measured: the seconds of root-only steps that asked the drafter against those that did not
    (paused or skipped: pausing's trials and hopeless proposals give the first); skipping goes on
    while the difference is over `idle_cost` of a step, since each skipped step may miss the first
    tokens of a burst (replayed on the recorded traces, where asking is free, skipping regardless
    cost 1-2 % of the tokens per step).

    Now and then it verifies a neighbouring menu size instead (one up or one down from its choice,
    alternately), so one slow measurement (a page fault, another process) cannot stick forever and
    a better size nearby gets found: after `explore_every` steps, then at intervals that grow by
    `explore_backoff` while the choice stays the same (up to 16x), since each exploration of a size
    that is worse costs a step's worth of its difference, and back to `explore_every` when the choice
    changes. One budget lives as long as its verifier, serving whatever workload comes, so the
    acceptance evidence fades with a memory of `memory` steps: after code completion, a chat
    workload's lower acceptance takes effect within a few requests.

    Measured by replaying the recorded SmolLM2 traces (HumanEval then MT-Bench in one session, and
    the reverse) on the synthetic clock of each cost table (benchmarks/budget_sim.py): backoff 2 and
    memory 6000 against none (backoff 1, memory None) give, simulated speedup over plain decoding,
    HF CPU (the `hf-cpu-unpacked` table) 1.80x / 1.37x and 1.40x / 1.85x (none: 1.78x / 1.37x and
    1.40x / 1.84x), llama.cpp CPU 1.03x / 1.03x and 1.00x / 1.09x (none: 1.02x / 1.00x and
    0.99x / 1.05x); a flat GPU cost is unchanged (2.86x / 1.83x).

        parameter        default  meaning
        max_nodes        64       most drafted candidates ever verified (at most what one verify can
                                  hold on this machine: validate.max_tree_nodes)
        smoothing        0.2      weight of a new cost measurement in its size's average
        optimism         0.05     unmeasured size's guessed cost growth per node, relative to 1 node
        explore_every    16       steps before a neighbouring size is re-measured
        explore_backoff  2        factor on that interval while the choice stays the same (1: fixed)
        memory           6000     steps after which acceptance evidence has faded to 1/e (None: never)
        window_cost      0.1      a lookahead window rides along only while it adds at most this
                                  share to a step's cost (measured per window size; a window never
                                  measured is tried). Window nodes are never accepted: what they buy
                                  is future candidates (a Jacobi pool), worth a small price where
                                  verify is nearly free (a GPU) and not a doubled step (a CPU).
                                  Once one is dropped, a drafter that can leave its window out is
                                  asked for one only every 16th step (`LookaheadProbe`).
        trial_every      64       steps between trials of the arm not in use: drafting or pausing
        idle_skip        3        most steps skipped after proposals in a row that drafted nothing
                                  (0: only a hopeless proposal skips one)
        idle_cost        0.02     skip those only while asking the drafter costs more than this
                                  share of a root-only step
        trial_steps      16       steps a trial of drafting lasts (a trial of pausing: 4; 0: never pause)

    Pausing. Choosing "no draft" for a step still pays for drafting it (the drafter's proposal, the
    choice), a few percent of a step where the verify itself is cheap (llama.cpp on a CPU: a merged
    tree from three drafters costs ~0.4 ms of an 11 ms step). So the budget also measures whether
    drafting pays at all: two arms, "draft" (ask the drafter, choose, verify) and "pause" (verify the
    root alone without asking the drafter), each with its tokens per second over its recent steps;
    the better arm runs and the other one is tried every `trial_every` steps, that interval growing by
    `explore_backoff` (up to 16x) while the winner stays the same, except that a trial pausing won
    against at least 2 * `trial_every` drafting steps is confirmed (or not) by another after
    `trial_every` steps. A trial of pausing is short (a
    paused step always costs the same and emits one token); a trial of drafting lasts `trial_steps`
    steps, since what drafting gains comes in bursts (a repeated span, then nothing). The first trial
    comes after `trial_every` drafting steps, and the first half of those, spent learning sizes and
    acceptance, does not count as drafting's worth. Paused
    steps teach no cost and no acceptance (nothing was drafted); the drafter still sees every
    accepted token through `update`, so it is ready when a trial finds drafting paying again.
    """

    _BINS = 20   # score bins
    _RANKS = 6   # rank buckets: 1, 2-3, 4-7, 8-15, 16-31, 32+
    _DRAFT, _PAUSE = 0, 1   # arms
    _ARM_MEMORY = 256       # an arm's steps after which its evidence has faded to 1/e
    _PAUSE_TRIAL = 4        # steps a trial of pausing lasts
    _PAUSE_MARGIN = 0.05    # pausing must beat drafting by this much, in two trials running: a
                            # burst of accepted drafts missed while paused costs more than a few
                            # percent of drafting overhead, and step times are noisy
    _SETTLED_TRIALS = 2     # drafting steps, in trial_every's, before a won pause trial is confirmed soon
    _BIAS_MEMORY = 32       # proposals after which bias evidence has faded to 1/e
    _BIAS_PRIOR = 4.0       # expected tokens of evidence that the calibration is right
    _BIAS_FLOOR = 0.25      # the correction never scales the expectation below this
    _GAMBLE_MEMORY = 32     # verified trees after which the gamble correction's evidence has faded to 1/e
    _GAMBLE_PRIOR = 12.0    # expected tokens of evidence that the verified trees deliver their estimate
    _GAMBLE_FLOOR = 0.6     # the gamble correction never scales the expectation below this
    _ROOT_SMOOTHING = 0.02  # weight of a root-only step in its average (asked the drafter or not): the
                            # difference sought is a few percent of a step, so it averages many
    _OUTLIER = 2.0          # a step's seconds count as at most this times its size's estimate
    _HOPELESS = 0.5         # a proposal worth less than this share of no draft skips the next one,
                            # and a neighbouring size worth less than this share is not explored

    def __init__(self, max_nodes: int = 64, smoothing: float = 0.2, optimism: float = 0.05,
                 explore_every: int = 16, explore_backoff: int = 2, memory: float | None = 6000.0,
                 window_cost: float = 0.1, trial_every: int = 64, trial_steps: int = 16, idle_skip: int = 3,
                 idle_cost: float = 0.02):
        # Asked of the drafter every step, and its rank table is sized by it: a tree of more nodes than
        # one verify can hold is refused (validate.max_tree_nodes), not allocated for.
        self.max_nodes = tree_size("max_nodes", max_nodes, minimum=1)
        self.smoothing = positive_float("smoothing", smoothing)
        if self.smoothing > 1.0:
            raise ConfigError(f"smoothing: expected a number in (0, 1], got {smoothing}")
        self.optimism = positive_float("optimism", optimism, inclusive=True)
        self.explore_every = positive_int("explore_every", explore_every)
        self.explore_backoff = positive_int("explore_backoff", explore_backoff)
        self.memory = None if memory is None else positive_float("memory", memory, minimum=1.0, inclusive=True)
        self.window_cost = window_cost if isinstance(window_cost, float) and window_cost == math.inf \
            else positive_float("window_cost", window_cost, inclusive=True)
        self.trial_every = positive_int("trial_every", trial_every)
        self.trial_steps = positive_int("trial_steps", trial_steps, minimum=0)
        self.idle_skip = positive_int("idle_skip", idle_skip, minimum=0)
        self.idle_cost = positive_float("idle_cost", idle_cost, minimum=0.0, inclusive=True)
        self._arm = self._DRAFT                   # the arm of the step under way
        self._winner = self._DRAFT
        self._arm_tokens = np.zeros(2)            # faded sums per arm: tokens emitted, seconds
        self._arm_seconds = np.zeros(2)
        self._arm_steps = np.zeros(2, np.int64)
        self._trial_left = 0                      # steps left in the running trial of the other arm
        self._pause_won_last = False              # whether pausing won the last trial
        self._next_trial = self.trial_every
        self._trial_period = self.trial_every
        self._period = self.explore_every   # steps until the next exploration
        self._next_explore = self.explore_every - 1
        self._n_explored = 0
        self._last_best = -1
        self.sizes = _menu(self.max_nodes + 1)   # candidate-tree sizes (nodes, root included)
        self._menu_entry = {int(size): i for i, size in enumerate(self.sizes)}   # observe's lookup, every step
        self._cost: dict[int, np.ndarray] = {}   # n_lookahead -> seconds per step, by menu entry
        self._step = 0
        # Calibration counts per (score bin, rank bucket), with a weak prior that the score is right.
        centres = (np.arange(self._BINS) + 0.5) / self._BINS
        self._offered = np.full((self._BINS, self._RANKS), 2.0)
        self._accepted = np.repeat(2.0 * centres[:, None], self._RANKS, axis=1)
        self._prior_offered, self._prior_accepted = self._offered.copy(), self._accepted.copy()
        # Caches of what choose() reads every step, refreshed when observe() changes their inputs.
        self._probability = (self._accepted / self._offered).ravel()
        self._estimates: dict[int, np.ndarray] = {}
        self._rank_bucket = _rank_buckets(self.max_nodes + 2, self._RANKS)
        self._lookahead = LookaheadProbe()
        self._bias_expected = 0.0   # faded sums over proposals: expected and accepted tokens of the
        self._bias_accepted = 0.0   # prefix choose() would have picked without the bias correction
        self._gamble_expected = 0.0  # faded sums over verified trees: their expected tokens (bias
        self._gamble_accepted = 0.0  # corrected) and their accepted tokens
        self._sees_outcomes = False  # the loop reports outcomes (speculate does; a draft model does not)
        self._idle = 0              # proposals in a row that drafted nothing
        self._skip_left = 0         # steps left that ask the drafter for nothing (see choose)
        self._asked = False         # this step's proposal reached choose()
        self._root_seconds = [math.nan, math.nan]   # root-only steps that [asked, did not ask] the drafter
        self._kernels = kernels("draftcore.budget_kernels")

    # -- the policy ---------------------------------------------------------------------------
    def request_size(self) -> int:
        self._asked = False
        if self.trial_steps and self._trial_left == 0 and self._step >= self._next_trial:
            self._trial_left = self._PAUSE_TRIAL if self._winner == self._DRAFT else self.trial_steps
        self._arm = 1 - self._winner if self._trial_left else self._winner
        if self._arm == self._DRAFT and self._skip_left:
            self._skip_left -= 1     # after proposals that drafted nothing (see choose)
            return 0
        return self.max_nodes if self._arm == self._DRAFT else 0

    @property
    def drafting_pays(self) -> bool:
        """Whether drafting is the better arm now (False: steps verify the root alone, drafting
        only in trials)."""
        return self._winner == self._DRAFT

    def tokens_per_second(self) -> tuple[float, float]:
        """Recent tokens per second of the (draft, pause) arms; NaN for an arm never run."""
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = self._arm_tokens / self._arm_seconds
        return float(rate[0]) if self._arm_steps[0] else float("nan"), \
            float(rate[1]) if self._arm_steps[1] else float("nan")

    def choose(self, tree: DraftTree) -> int:
        self._asked = True
        n_draft = min(tree.n_draft, self.max_nodes)
        if n_draft == 0:
            return self._drafted(0, False)
        if np.isnan(self._costs(tree.n_lookahead)[0]):
            return 0  # first measure what a step without candidates costs
        sizes, value = self._values(tree, n_draft, self.bias() * self.gamble_correction())
        n_menu = sizes.shape[0]
        best = int(np.argmax(value))
        # A proposal whose best draft is worth less than half of no draft says the drafter has
        # nothing here; the next step verifies the root without asking it. Where a step is a few
        # ms (llama.cpp on a CPU) asking costs: the composite drafted in 0.2 ms of a 5.6 ms step
        # there, and most steps chose no draft.
        hopeless = n_menu > 1 and value[1:].max() < self._HOPELESS * value[0]
        if best != self._last_best:
            self._last_best, self._period = best, self.explore_every
        if self._step >= self._next_explore:
            # Re-measure a neighbouring size (one up or down, alternately): local, so the
            # exploration itself stays cheap where big trees are expensive; and not one worth less
            # than half the choice, which no re-measured cost would make the better one (llama.cpp
            # on a CPU re-measured a 2-token step, twice a 1-token one, for a 5 % candidate).
            near = best + (1 if self._n_explored % 2 == 0 else -1)
            self._n_explored += 1
            self._next_explore = self._step + self._period
            self._period = min(self._period * self.explore_backoff, 16 * self.explore_every)
            if 0 <= near < n_menu and value[near] >= self._HOPELESS * value[best]:
                best = near
        return self._drafted(int(sizes[best]) - 1, hopeless)

    def _drafted(self, k: int, hopeless: bool) -> int:
        """Return choose's `k`, having set how many next steps ask the drafter for nothing: a
        proposal that drafts nothing, the k-th in a row, skips min(k - 1, idle_skip) of them (a
        hopeless one at least 1); one that drafts skips none."""
        if k:
            self._idle = self._skip_left = 0
        else:
            self._idle += 1
            skip = min(self._idle - 1, self.idle_skip) if self.asking_costs() else 0
            self._skip_left = max(skip, 1 if hopeless else 0)
        return k

    def asking_costs(self) -> bool:
        """Whether a root-only step that asked the drafter took over `idle_cost` more than one that
        did not; False until both are measured (steps that did not ask come from pausing, its
        trials and hopeless proposals)."""
        asked, unasked = self._root_seconds
        return bool(asked - unasked > self.idle_cost * unasked)   # NaN compares False

    def bias(self) -> float:
        """What the calibration's expectation is worth on the trees it verifies or would verify:
        recent accepted over expected (uncorrected) tokens of the prefix it verified (`observe`) or,
        where the correction made it verify less, would have verified (`observe_outcomes`); in
        [_BIAS_FLOOR, 1]. 1 for a caller that reports no outcomes."""
        rate = (self._bias_accepted + self._BIAS_PRIOR) / (self._bias_expected + self._BIAS_PRIOR)
        return min(1.0, max(self._BIAS_FLOOR, rate))

    def gamble_correction(self) -> float:
        """What the bias-corrected expectation is worth on the trees it verifies: recent accepted
        over expected tokens of its verified trees, in [_GAMBLE_FLOOR, 1]; 1 for a caller that
        reports no outcomes. The trees it verifies are those whose estimates looked best against
        no draft, so their estimates err high more than the average proposal's (the winner's
        curse): replayed on llama.cpp CPU costs, the composite's verified trees accepted 0.70 of
        their corrected expectation, the trie's 0.82. Learnt from verified trees only, it could stop
        the budget verifying; the floor keeps a tree worth 1 / 0.6 of its estimate verified, and
        its outcome teaches the correction again."""
        rate = (self._gamble_accepted + self._GAMBLE_PRIOR) / (self._gamble_expected + self._GAMBLE_PRIOR)
        return min(1.0, max(self._GAMBLE_FLOOR, rate))

    def keep_lookahead(self, tree: DraftTree, n_draft: int) -> bool:
        """Keep the window while its measured (or, unmeasured, optimistically guessed) extra cost
        is at most `window_cost` of the same step without it."""
        if self.window_cost == float("inf"):
            return True
        nodes = np.array([n_draft + 1])
        with_window = float(self.cost(nodes, tree.n_lookahead)[0])
        without = float(self.cost(nodes, 0)[0])
        return self._lookahead.decided(with_window <= (1.0 + self.window_cost) * without)

    def wants_lookahead(self) -> bool:
        """Whether to build a lookahead window this step (`LookaheadProbe`: always while windows are
        kept; once one is dropped, every 16th step)."""
        return self._lookahead.wants()

    def observe(self, tree: DraftTree, path: np.ndarray, seconds: float) -> None:
        # NaN or a negative time too: one bad time would steer every later choice
        if not isinstance(seconds, (int, float, np.number)) or not 0 <= seconds < math.inf:
            raise InputError(f"seconds: expected the step's finite duration >= 0, got {seconds!r}")
        self._step += 1
        if tree.n_candidates == 1 and not tree.n_lookahead:
            self._learn_root_seconds(0 if self._asked else 1, seconds)
        arm, self._arm = self._arm, self._DRAFT
        self._observe_arm(arm, path.shape[0], seconds)
        if arm == self._PAUSE:
            return   # nothing drafted: no cost of a drafting step, no acceptance
        if tree.n_draft and self._sees_outcomes:
            # The verified prefix's uncorrected expectation, before it is learnt from. Only where the
            # loop reports outcomes: a correction learnt from verified trees alone could fall and
            # then never see the trees it stopped verifying come true.
            p = self._probabilities(tree, tree.n_candidates)
            expected = float(self._kernels.expected_accepted(p, tree.parents, tree.n_candidates)[-1])
            keep = 1.0 - 1.0 / self._GAMBLE_MEMORY
            self._gamble_expected = keep * self._gamble_expected + expected * self.bias()
            self._gamble_accepted = keep * self._gamble_accepted + (path.shape[0] - 1.0)
            self._learn_bias(expected, path.shape[0] - 1.0)
        i = self._entry(tree.n_candidates)
        if i is not None:  # a size off the menu (a drafter that returned fewer nodes) teaches nothing
            costs = self._costs(tree.n_lookahead)
            # One slow step (a page fault, a collection, another process) counts as at most twice
            # the estimate: on llama.cpp a 40 ms root-only step once raised its estimate from 5.5 to
            # 12.4 ms, above a 2-token step's, and the budget then verified a candidate every step
            # (k = 1 at twice the cost) while no-draft steps, never chosen, were seldom re-measured.
            costs[i] = _smoothed(costs[i], seconds, self.smoothing, self._OUTLIER)
            self._estimates.clear()
        if self.memory is not None:  # forget old evidence, keep the prior
            keep = 1.0 - 1.0 / self.memory
            self._offered = self._prior_offered + keep * (self._offered - self._prior_offered)
            self._accepted = self._prior_accepted + keep * (self._accepted - self._prior_accepted)
        if tree.n_draft:
            cells = self._cells(tree, tree.n_candidates)[1:]
            accepted = np.zeros(tree.n_candidates, bool)
            accepted[path] = True
            flat_offered, flat_accepted = self._offered.reshape(-1), self._accepted.reshape(-1)
            np.add.at(flat_offered, cells, 1.0)
            np.add.at(flat_accepted, cells, accepted[1:])
        if tree.n_draft or self.memory is not None:
            self._probability = (self._accepted / self._offered).ravel()

    def observe_outcomes(self, tree: DraftTree, verified: int, outcome: np.ndarray) -> None:
        """What the emitted tokens showed of a whole proposal (draftcore.outcomes): `outcome` per
        node of `tree` (root and candidates), 1 would have been accepted, 0 not, -1 unknown. The
        candidates after the first `verified` (not seen by `observe`) join the calibration; the
        prefix `choose` would pick without the bias correction, where longer than what was verified,
        measures the bias (a verified prefix measured it in `observe`, without waiting)."""
        self._sees_outcomes = True
        n = tree.n_candidates
        if n <= 1:
            return
        cells = self._cells(tree, n)
        costs_known = not np.isnan(self._costs(0)[0])
        expected, hits = self._kernels.learn_outcomes(
            self._offered.reshape(-1), self._accepted.reshape(-1), self._probability, cells, outcome, verified,
            tree.parents, n, self.sizes if costs_known else self.sizes[:0], self._estimated(0))
        if expected >= 0.0:   # the prefix it would pick uncorrected, longer than what was verified
            self._learn_bias(expected, hits)

    def _learn_root_seconds(self, i: int, seconds: float) -> None:
        # Python floats: numpy scalars cost µs a step here
        self._root_seconds[i] = _smoothed(self._root_seconds[i], seconds, self._ROOT_SMOOTHING, self._OUTLIER)

    def _learn_bias(self, expected: float, accepted: float) -> None:
        keep = 1.0 - 1.0 / self._BIAS_MEMORY
        self._bias_expected = keep * self._bias_expected + expected
        self._bias_accepted = keep * self._bias_accepted + accepted

    def _values(self, tree: DraftTree, n_draft: int, bias: float):
        """(menu sizes up to n_draft + 1 nodes, expected tokens per second of each, the bias
        correction applied), the tree's window priced in."""
        p = self._probabilities(tree, n_draft + 1)
        expected = self._kernels.expected_accepted(p, tree.parents, n_draft + 1)
        n_menu = int(np.searchsorted(self.sizes, n_draft + 1, side="right"))
        sizes = self.sizes[:n_menu]
        value = (1.0 + bias * expected[sizes - 1]) / self._estimated(tree.n_lookahead)[:n_menu]
        return sizes, value

    def _probabilities(self, tree: DraftTree, m: int) -> np.ndarray:
        """float64[m]: the calibrated acceptance of the tree's first m nodes (the root: 1)."""
        p = self._probability[self._cells(tree, m)]   # a copy (fancy indexing)
        p[0] = 1.0
        return p

    def _observe_arm(self, arm: int, tokens: int, seconds: float) -> None:
        if self._step <= self.trial_every // 2:
            return   # the first steps measure sizes and acceptance, not what drafting is worth
        keep = 1.0 - 1.0 / self._ARM_MEMORY
        self._arm_tokens[arm] = keep * self._arm_tokens[arm] + tokens
        self._arm_seconds[arm] = keep * self._arm_seconds[arm] + seconds
        self._arm_steps[arm] += 1
        if not self._trial_left:
            return
        self._trial_left -= 1
        if self._trial_left:
            return
        # A trial ended: pausing wins by a margin, and takes over only after winning two trials running.
        draft_rate = self._arm_tokens[0] / self._arm_seconds[0] if self._arm_seconds[0] > 0 else 0.0
        pause_rate = self._arm_tokens[1] / self._arm_seconds[1] if self._arm_steps[1] else 0.0
        pause_wins = pause_rate > (1.0 + self._PAUSE_MARGIN) * draft_rate
        winner = self._PAUSE if pause_wins and (self._winner == self._PAUSE or self._pause_won_last) else self._DRAFT
        self._pause_won_last = pause_wins
        if winner != self._winner:
            self._winner, self._trial_period = winner, self.trial_every
        elif pause_wins and self._winner == self._DRAFT and \
                self._arm_steps[self._DRAFT] >= self._SETTLED_TRIALS * self.trial_every:
            # Pausing won once against a drafting record long enough to judge: confirm it soon.
            # Backing off here let one burst of accepted drafts just before a confirming trial keep
            # a losing arm for hundreds of steps (llama.cpp on a CPU, HumanEval: the composite
            # drafted at 0.91x of pausing for a whole dataset). A first trial that drafting loses
            # while it still learns sizes and acceptance is confirmed only after the backed-off
            # interval (HF on MT-Bench: confirming it soon paused a trie that pays 1.2x).
            self._trial_period = self.trial_every
        else:
            self._trial_period = min(self._trial_period * self.explore_backoff, 16 * self.trial_every)
        self._next_trial = self._step + self._trial_period

    # -- what it has learnt (also for reports) -------------------------------------------------
    def cost(self, n_nodes, n_lookahead: int = 0) -> np.ndarray:
        """Estimated seconds of a step that verifies `n_nodes` candidate nodes (array-like, root
        included) plus `n_lookahead` lookahead nodes, interpolated between menu sizes."""
        return np.interp(np.asarray(n_nodes, float), self.sizes, self._estimated(n_lookahead))

    def acceptance_by_score(self) -> np.ndarray:
        """Calibrated acceptance probability per score bin (rows) and rank bucket (for reports)."""
        return self._accepted / self._offered

    # -- internals -----------------------------------------------------------------------------
    def _costs(self, n_lookahead: int) -> np.ndarray:
        costs = self._cost.get(n_lookahead)
        if costs is None:
            costs = self._cost[n_lookahead] = np.full(len(self.sizes), np.nan)
        return costs

    def _estimated(self, n_lookahead: int) -> np.ndarray:
        """Seconds per menu size with `n_lookahead` lookahead nodes: measured where measured, else
        guessed from the step with the fewest nodes measured so far (with any window)."""
        estimate = self._estimates.get(n_lookahead)
        if estimate is None:
            estimate = self._estimates[n_lookahead] = self._estimate(n_lookahead)
        return estimate

    def _estimate(self, n_lookahead: int) -> np.ndarray:
        known = self._costs(n_lookahead).copy()
        missing = np.isnan(known)
        total = self.sizes + n_lookahead - 1.0   # nodes beyond a root-only tree
        growth = 1.0 + self.optimism * total
        if not missing.any():
            return known
        base = 1.0
        # The measured step with the fewest nodes (ties: the cheaper), over every window size: in
        # each window's table that is its first measured size. Runs every step: no per-entry loop.
        fewest = None
        for window, costs in self._cost.items():
            measured = np.flatnonzero(~np.isnan(costs))
            if measured.size:
                i = int(measured[0])
                candidate = (float(self.sizes[i]) + window - 1.0, float(costs[i]))
                fewest = candidate if fewest is None else min(fewest, candidate)
        if fewest is not None:
            extra, seconds = fewest
            base = seconds / (1.0 + self.optimism * extra)
        guess = base * growth
        # Where this table has measured two sizes below a missing one, the cost can be seen to grow:
        # guess at least the largest measured smaller size plus half the slope measured so far.
        # Without this floor llama.cpp on a CPU (about 2.7 ms more per node) had sizes 32, 48 and 63
        # guessed at 12, 17 and 21 ms and tried once each, at 92, 129 and 168 ms.
        measured = np.flatnonzero(~missing)
        if measured.size >= 2:
            below = np.searchsorted(measured, np.arange(len(known))) - 1   # per entry: last measured below
            j = measured[np.maximum(below, 0)]
            first = measured[0]
            with np.errstate(invalid="ignore", divide="ignore"):
                slope = np.maximum((known[j] - known[first]) / (self.sizes[j] - self.sizes[first]), 0.0)
            floor = known[j] + 0.5 * slope * (self.sizes - self.sizes[j])
            has_floor = missing & (below >= 1)
            guess[has_floor] = np.maximum(guess[has_floor], floor[has_floor])
        known[missing] = guess[missing]
        return known

    def _entry(self, n_nodes: int):
        return self._menu_entry.get(n_nodes)

    def _cells(self, tree: DraftTree, m: int) -> np.ndarray:
        """Flat calibration cell of the first m nodes: score bin * _RANKS + rank bucket."""
        bins = tree.score_bins(self._BINS, 0, m)
        if m > self._rank_bucket.shape[0]:
            self._rank_bucket = _rank_buckets(m, self._RANKS)
        return bins * self._RANKS + self._rank_bucket[:m]


def _smoothed(old: float, seconds: float, weight: float, outlier: float) -> float:
    """A step time's moving average: `seconds` itself where none was measured (NaN), else `weight`
    of it, counted as at most `outlier` times the average (one slow step must not stick)."""
    return seconds if math.isnan(old) else (1 - weight) * old + weight * min(seconds, outlier * old)


def _rank_buckets(n: int, n_buckets: int) -> np.ndarray:
    """int64[n]: the rank bucket of best-first positions 0 .. n-1: 1, 2-3, 4-7, ... (the root: 0)."""
    return np.minimum(np.log2(np.maximum(np.arange(n), 1)).astype(np.int64), n_buckets - 1)


def _menu(largest: int) -> np.ndarray:
    """Tree sizes worth measuring up to `largest`: every size to 6, then 8, 12, 16, 24, 32, 48, 64,
    96, ... (alternately x1.5 and x1.33), and `largest` itself."""
    sizes = [s for s in range(1, 7)]
    step = 2
    while sizes[-1] < largest:
        nxt = sizes[-1] + step
        sizes.append(nxt)
        if nxt >= 4 * step:
            step *= 2
    sizes = [s for s in sizes if s < largest] + [largest]
    return np.array(sorted(set(sizes)), np.int64)


def as_budget_policy(budget):
    """An int becomes a FixedBudget; a policy object (request_size, choose, observe) is used as it is."""
    if all(callable(getattr(budget, m, None)) for m in ("request_size", "choose", "observe")):
        return budget
    if isinstance(budget, str):
        raise ConfigError(f"budget: expected None, 'auto', an int or a budget policy, got {budget!r}")
    return FixedBudget(budget)
