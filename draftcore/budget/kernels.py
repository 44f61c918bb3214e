"""Numba kernels behind `CostAwareBudget` (loaded through `draftcore.jit.kernels`, never at import:
draftcore.budget imports no module that imports this one)."""
import numba as nb
import numpy as np


@nb.njit(cache=True)
def expected_accepted(p, parents, n):
    """float64[n]: [k] the expected accepted candidates of a tree's first k, from each candidate's
    calibrated acceptance p[i] made consistent with the tree: the children of a node share at most
    its own probability (two siblings calibrated at 0.8 do not make 1.6 tokens)."""
    out = np.zeros(n)
    child_sum = np.zeros(n)
    q = np.zeros(n)
    q[0] = 1.0
    for k in range(1, n):
        child_sum[parents[k]] += p[k]
        total = 0.0
        for i in range(1, k + 1):
            parent = parents[i]
            share = q[parent] / child_sum[parent]
            q[i] = p[i] * share if share < 1.0 else p[i]
            total += q[i]
        out[k] = total
    return out


@nb.njit(cache=True)
def affords(step_units, slack, max_loss):
    """The floor's one cut (draftcore.budget.floor): whether a step of `step_units` root-only steps
    that accepts nothing keeps a request's `slack` at or above zero (NaN: not afforded)."""
    return step_units - (1.0 + max_loss) <= slack


@nb.njit(cache=True)
def affordable(step_units, slack, max_loss):
    """FloorGuard.affordable: `affords` per menu entry, the root-only entry (0) always."""
    out = np.empty(step_units.shape[0], np.bool_)
    for j in range(step_units.shape[0]):
        out[j] = j == 0 or affords(step_units[j], slack, max_loss)
    return out


@nb.njit(cache=True, error_model="numpy")   # a clock that never advanced gives 0 s: inf or NaN, as numpy's
def menu_values(p, parents, n, sizes, n_menu, estimates, correction, slack, max_loss, hopeless_share):
    """CostAwareBudget.choose's arithmetic: (tokens per second per menu entry, (1 + correction *
    expected accepted) / estimate, 0 where `affords` refuses it; the best entry, the first of equals
    and NaN as numpy's argmax sees it; whether no drafted entry is worth `hopeless_share` of the root)."""
    expected = expected_accepted(p, parents, n)
    value = np.empty(n_menu)
    for j in range(n_menu):
        value[j] = (1.0 + correction * expected[sizes[j] - 1]) / estimates[j]
    hopeless = False
    if n_menu > 1:
        top = -np.inf
        has_nan = False
        for j in range(1, n_menu):
            if np.isnan(value[j]):
                has_nan = True
            elif value[j] > top:
                top = value[j]
        hopeless = not has_nan and top < hopeless_share * value[0]
    if estimates[0] > 0:
        for j in range(1, n_menu):
            if not affords(estimates[j] / estimates[0], slack, max_loss):
                value[j] = 0.0
    best = 0
    for j in range(1, n_menu):
        if np.isnan(value[best]):
            break
        if np.isnan(value[j]) or value[j] > value[best]:
            best = j
    return value, best, hopeless


@nb.njit(cache=True, error_model="numpy")   # a clock that never advanced gives 0 s: inf, as numpy's
def learn_outcomes(offered, accepted, probability, cells, outcome, verified, parents, n, sizes, seconds):
    """Calibration.learn_outcomes: counts the known outcomes of candidates verified+1 .. n-1 into
    their cells (flat views, in place); returns (expected, accepted) tokens of the prefix the
    calibration alone picks, or (-1, 0) where it is no longer than `verified` or not fully known."""
    for i in range(verified + 1, n):
        if outcome[i] >= 0:
            cell = cells[i]
            offered[cell] += 1.0
            accepted[cell] += outcome[i]
            probability[cell] = accepted[cell] / offered[cell]
    if sizes.shape[0] == 0:
        return -1.0, 0.0
    p = np.empty(n)
    p[0] = 1.0
    for i in range(1, n):
        p[i] = probability[cells[i]]
    expected = expected_accepted(p, parents, n)
    best, best_value = 0, -1.0
    for j in range(sizes.shape[0]):
        if sizes[j] > n:
            break
        value = (1.0 + expected[sizes[j] - 1]) / seconds[j]
        if value > best_value:
            best, best_value = j, value
    k = sizes[best] - 1
    if k <= verified:
        return -1.0, 0.0
    hits = 0
    for i in range(1, k + 1):
        if outcome[i] < 0:
            return -1.0, 0.0
        hits += outcome[i]
    return expected[k], float(hits)


@nb.njit(cache=True)
def measured_growth(known, sizes):
    """Per menu entry, the cost guessed from the growth measured around it at half its slope (NaN
    below the first measured size, or while fewer than two are); `known`: NaN where never measured."""
    n = known.shape[0]
    guess = np.full(n, np.nan)
    measured = np.empty(n, np.int64)
    m = 0
    for i in range(n):
        if not np.isnan(known[i]):
            measured[m] = i
            m += 1
    if m < 2:
        return guess
    first = measured[0]
    below = -1   # position in `measured` of the last measured entry at or below e
    for e in range(n):
        while below + 1 < m and measured[below + 1] <= e:
            below += 1
        if below < 0:
            continue
        j = measured[below]
        if below + 1 < m:   # between two measured sizes: the local slope
            k = measured[below + 1]
            slope = (known[k] - known[j]) / (sizes[k] - sizes[j])
        else:               # above the largest: the slope from the smallest measured up to it
            slope = (known[j] - known[first]) / (sizes[j] - sizes[first])
        slope = max(slope, 0.0)
        guess[e] = known[j] + 0.5 * slope * (sizes[e] - sizes[j])
    return guess


@nb.njit(cache=True)
def guessed_costs(known, sizes, base, optimism):
    """CostTable._guess without a window or a prior: each NaN of `known` from `measured_growth`,
    else `base` growing by `optimism` per node."""
    growth = measured_growth(known, sizes)
    out = known.copy()
    for e in range(known.shape[0]):
        if np.isnan(out[e]):
            if np.isnan(growth[e]):
                out[e] = base * (1.0 + optimism * (sizes[e] - 1.0))
            else:
                out[e] = growth[e]
    return out


@nb.njit(cache=True)
def fade_counts(offered, accepted, prior_offered, prior_accepted, keep, probability):
    """Calibration's fade, in place: count = prior + keep * (count - prior), `probability` refreshed."""
    n_bins, n_ranks = offered.shape
    for b in range(n_bins):
        for k in range(n_ranks):
            po, pa = prior_offered[b, k], prior_accepted[b, k]
            offered[b, k] = po + keep * (offered[b, k] - po)
            accepted[b, k] = pa + keep * (accepted[b, k] - pa)
            probability[b * n_ranks + k] = accepted[b, k] / offered[b, k]


@nb.njit(cache=True)
def calibration_cells(scores, depths, m, n_bins, rank_bucket, n_ranks):
    """int64[m]: the cell of a tree's first m nodes as DraftTree.score_bins bins them (the product in
    the scores' own precision, so bin edges fall where numpy's do; no scores: 0.5 ** depth)."""
    out = np.empty(m, np.int64)
    n_bins_f32 = np.float32(n_bins)
    for i in range(m):
        if scores.shape[0]:
            b = np.int64(scores[i] * n_bins_f32)
        else:
            b = np.int64(0.5 ** np.float64(depths[i]) * n_bins)
        b = min(max(b, 0), n_bins - 1)
        out[i] = b * n_ranks + rank_bucket[i]
    return out


def warm_up() -> None:
    parents = np.array([-1, 0, 0, 1], np.int32)
    expected_accepted(np.array([1.0, 0.5, 0.5, 0.9]), parents, 4)
    menu_values(np.array([1.0, 0.5, 0.5, 0.9]), parents, 4, np.array([1, 2, 3, 4], np.int64), 4, np.ones(4), 1.0,
                1.0, 0.02, 0.5)
    counts = np.ones(4)
    learn_outcomes(counts, counts * 0.5, counts * 0.5, np.arange(4), np.array([1, 1, 0, -1], np.int8), 0,
                   parents, 4, np.array([1, 2, 3, 4]), np.ones(4))
    affordable(np.array([1.0, 2.0]), 1.0, 0.02)
    measured_growth(np.array([1.0, np.nan, 2.0, np.nan]), np.array([1, 2, 3, 4], np.int64))
    guessed_costs(np.array([1.0, np.nan, 2.0, np.nan]), np.array([1, 2, 3, 4], np.int64), 1.0, 0.05)
    table = np.ones((2, 3))
    fade_counts(table.copy(), table * 0.5, table, table * 0.5, 0.9, np.empty(6))
    rank_bucket = np.zeros(4, np.int64)
    calibration_cells(np.ones(4, np.float32), parents, 4, 20, rank_bucket, 6)
    calibration_cells(np.empty(0, np.float32), parents, 4, 20, rank_bucket, 6)
