"""Why a greedy output differs from plain decoding's: a near-tie, or a bug (DESIGN.md: every
difference is explained as a near-tie or called a bug).

At the first position where the two outputs differ, plain decoding's logits there (after the
prompt and plain's output up to that position) rank plain's token first; the gap between that top-1
logit and the other output's token is how far the two computations would have to disagree for the
other token to win. Within the numerics bound of the dtype and backend (k-token and one-token
forwards round differently) that is a near-tie; beyond it, a bug.
"""
from __future__ import annotations

import numpy as np

NEAR_TIE, BUG = "near-tie", "BUG"


def first_difference(plain, other) -> int | None:
    """The first position where the two token sequences differ (where one ends and the other goes
    on included); None where they are equal."""
    plain, other = np.asarray(plain), np.asarray(other)
    n = min(plain.shape[0], other.shape[0])
    differ = np.flatnonzero(plain[:n] != other[:n])
    if differ.size:
        return int(differ[0])
    return None if plain.shape[0] == other.shape[0] else n


def explain(prompt, plain, other, logits_after, bound: float) -> dict | None:
    """Where `other` first differs from `plain` (plain decoding's output after `prompt`), the two
    competing tokens, plain decoding's logit gap between them (top-1 minus the other's token) and
    the verdict: "near-tie" within `bound`, else "BUG". None where the outputs are equal.

    logits_after(ids: int64[T]) -> float[vocab]: plain decoding's logits for the token after ids.
    Where one output ends at that position there is no competing token to weigh: a bug."""
    position = first_difference(plain, other)
    if position is None:
        return None
    plain, other = np.asarray(plain), np.asarray(other)
    entry = {"position": position,
             "plain_token": int(plain[position]) if position < plain.shape[0] else None,
             "other_token": int(other[position]) if position < other.shape[0] else None}
    if entry["plain_token"] is None or entry["other_token"] is None:
        return dict(entry, gap=None, verdict=BUG)
    ids = np.concatenate([np.asarray(prompt), plain[:position]]).astype(np.int64)
    row = np.asarray(logits_after(ids), np.float64)
    gap = float(row.max() - row[entry["other_token"]])
    return dict(entry, gap=gap, verdict=NEAR_TIE if gap <= bound else BUG)
