"""Numba kernels of the trie's calibrated retrieval (`calibrated`, with `fill` and the hierarchical
layout; the default): the score of a candidate is the rate at which such candidates came true.

A relative weight w(v) / w(u) means little on its own: replayed on SmolLM2's traces, the same
relative weight came true far more often after a long match than after a short one
(docs/drafters.md). So each candidate gets a cell, (its context length m_eff, the bin of its
relative weight): a child of the stage matched on m tokens has m_eff = m (stage 0: 0), a deeper
node its parent's m_eff + 1 (capped at CAL_ROWS - 1), and the bin is where w(v) / w(u) falls
among CAL_EDGES. Its score is its parent's times the cell's observed rate (cal[1] / cal[0]), and
all stages offer into one candidate list (trie_retrieval_kernels), so a likely continuation of a
short match outranks an unlikely one of a long match, which plain `fill` always drafts first.
The rates are learnt from the drafter's own proposals (`learn`: a node whose parent's path came
true counts once in its cell, and a hit when its own token came true too), starting from a prior
of 2 candidates at the bin's centre; a cell's counts halve when they reach CAL_CAP, so they follow
the workload.

    cal   float64[2, CAL_CELLS] (TrieState.cal, shared by the requests): per cell, the candidates
          whose parent path came true (row 0) and those of them that came true too (row 1), the
          prior included
"""
import numba as nb
import numpy as np

CAL_EDGES = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9, 0.999)   # relative-weight bin edges
CAL_BINS = len(CAL_EDGES) + 1
CAL_ROWS = 13          # context lengths 0 .. 12 (longer counts as 12)
CAL_CELLS = CAL_ROWS * CAL_BINS
CAL_CAP = 1024.0       # a cell's count halves (with its hits) on reaching this
CAL_PRIOR = 2.0        # prior candidates per cell, at the bin's centre


def new_calibration() -> np.ndarray:
    """float64[2, CAL_CELLS]: the prior of every cell, CAL_PRIOR candidates at its bin's centre."""
    edges = (0.0,) + CAL_EDGES + (1.0,)
    centres = np.array([(edges[b] + edges[b + 1]) / 2 for b in range(CAL_BINS)])
    cal = np.empty((2, CAL_CELLS))
    cal[0] = CAL_PRIOR
    cal[1] = np.tile(CAL_PRIOR * centres, CAL_ROWS)
    return cal


@nb.njit(cache=True, inline="always")
def cell_of(m_eff, ratio):
    """Calibration cell of a candidate: its context length (capped) and its relative weight's bin."""
    b = 0
    while b < CAL_BINS - 1 and ratio >= CAL_EDGES[b]:
        b += 1
    return min(m_eff, CAL_ROWS - 1) * CAL_BINS + b


@nb.njit(cache=True, inline="always")
def calibrated_score(cal, score, m_eff, ratio):
    """(score, cell) of a candidate: its parent's score times its cell's observed rate; 0 where
    the node weighs nothing for this request (as uncalibrated: never drafted)."""
    cell = cell_of(m_eff, ratio)
    if ratio <= 0.0:
        return np.float32(0.0), cell
    return np.float32(score * (cal[1, cell] / cal[0, cell])), cell


@nb.njit(cache=True)
def learn(cal, stream, pos, tokens, parents, depths, cells, final):
    """Teach the calibration `cal` what became of one proposal drafted when the stream held `pos` tokens
    (its root the last of them): a node whose parent's path came true counts in its cell, and as a
    hit when its own token came true too. Nodes beyond the stream are not judged; unless `final`,
    nothing is learnt (False returned) until the stream reaches the proposal's deepest node."""
    known = stream.shape[0] - pos
    n = tokens.shape[0]
    if not final:
        for i in range(1, n):
            if depths[i] > known:
                return False
    came_true = np.zeros(n, np.bool_)
    came_true[0] = True
    for i in range(1, n):
        cell = cells[i]
        if cell < 0 or not came_true[parents[i]] or depths[i] > known:
            continue
        hit = stream[pos + depths[i] - 1] == tokens[i]
        cal[0, cell] += 1.0
        if hit:
            cal[1, cell] += 1.0
        if cal[0, cell] >= CAL_CAP:
            cal[0, cell] *= 0.5
            cal[1, cell] *= 0.5
        came_true[i] = hit
    return True


def warm_up() -> None:
    """Compile (or load from numba's cache) `learn` with the argument types a TrieRequest passes
    (a draft's rows as copied out of its buffers; draftcore.jit)."""
    stream = np.array([1, 2, 3, 1, 2], np.int32)
    rows = np.array([[3, 1, 2], [-1, 0, 1], [0, 1, 2], [0, 0, 0], [-1, 0, 1]], np.int32)
    learn(new_calibration(), stream, 3, rows[0], rows[1], rows[2], rows[4], True)
