"""Small pieces the benchmarks share: quiet fixed CPU threads, the spread of repeated runs, percentiles.

Benchmarks import it as a sibling module (`python benchmarks/x.py` puts benchmarks/ on sys.path).
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence


def fix_threads(threads: int = 1) -> None:
    """OpenMP threads that sleep when idle, and a fixed count: other processes share these cores.
    Call before torch or numpy is imported (they read these once)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, str(threads))


def spread(values: Sequence[float]) -> dict[str, float | int]:
    """Median, min and max of one figure over repeated runs (the report shows `median [min, max]`)."""
    if not values:
        raise ValueError("no runs to summarize")
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): a value that was actually observed."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(len(ordered) * q / 100) - 1))]
