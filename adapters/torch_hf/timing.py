"""Construction-time timing of alternative kernels on this machine (head.py's choice, per tree
size, among torch's Linear, weight_major.py and packed_linear.py)."""
from __future__ import annotations

import time
from typing import Callable, Hashable

import numpy as np
import torch


def interleaved_medians(calls: dict[Hashable, Callable[[], object]], reps: int = 3) -> dict[Hashable, float]:
    """Median seconds of each call over `reps` rounds that run every call once, in order, after
    one warm-up round (interleaved, so a slow moment of the machine hits every call alike)."""
    seconds = {key: [] for key in calls}
    with torch.inference_mode():
        for rep in range(reps + 1):
            for key, call in calls.items():
                start = time.perf_counter()
                call()
                if rep:
                    seconds[key].append(time.perf_counter() - start)
    return {key: float(np.median(s)) for key, s in seconds.items()}
