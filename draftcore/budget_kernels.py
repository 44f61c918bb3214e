"""Numba kernels behind `CostAwareBudget` (loaded through `draftcore.jit.kernels`, never at import)."""
import numba as nb
import numpy as np


@nb.njit(cache=True)
def expected_accepted(p, parents, n):
    """float64[n]: [k] the expected number of accepted candidates when the first k candidates of a
    tree are verified (k = 0 .. n-1), from each candidate's calibrated acceptance p[i] (p[0], the
    root, unused) made consistent with the tree: a node is accepted only if its parent is, and at
    most one child of a node is, so the children of a node share at most its own probability
    (scaled down together where their calibrated sum exceeds it). Calibration counts cells (score,
    rank), not trees: two siblings each calibrated at 0.8 would otherwise count 1.6 tokens."""
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
def learn_outcomes(offered, accepted, probability, cells, outcome, verified, parents, n, sizes, seconds):
    """CostAwareBudget.observe_outcomes in one call. Counts the known outcomes of candidates
    verified+1 .. n-1 into their calibration cells (offered, accepted and probability: flat views,
    updated in place), then finds the prefix the budget would pick uncorrected (the menu size with
    the best (1 + expected accepted) / seconds; sizes empty: none) and returns (its expected
    accepted tokens, its accepted tokens), or (-1, 0) where it is no longer than what was verified
    or an outcome in it is unknown."""
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
    """CostTable._measured_growth (draftcore.budget.costs, which says why) in one call: per menu
    entry, a guess from the cost growth measured around it, NaN where none is. known: float64[n]
    seconds per menu size, NaN where never measured; sizes: int64[n] the menu. Entries below the
    first measured size, and every entry while fewer than two are measured, are NaN. It runs on
    every drafting step (a root-only step's cost changes the guesses): a dozen numpy calls cost
    ~0.1 ms of a llama.cpp CPU step."""
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


def warm_up() -> None:
    parents = np.array([-1, 0, 0, 1], np.int32)
    expected_accepted(np.array([1.0, 0.5, 0.5, 0.9]), parents, 4)
    counts = np.ones(4)
    learn_outcomes(counts, counts * 0.5, counts * 0.5, np.arange(4), np.array([1, 1, 0, -1], np.int8), 0,
                   parents, 4, np.array([1, 2, 3, 4]), np.ones(4))
    measured_growth(np.array([1.0, np.nan, 2.0, np.nan]), np.array([1, 2, 3, 4], np.int64))
