"""Figures the benchmarks share."""


def percentile(values: list[float], pct: float) -> float:
    """The nearest-rank percentile (NaN for no values)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(pct / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]
