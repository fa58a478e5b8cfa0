"""The interval the lab puts on a share: the Wilson score interval, in one place.

`lab.eval.analysis` (accuracy tables, re-exported there as `lab.eval.analysis.wilson_interval`), `lab.runs.pipeline`
(the headline table) and `lab.core.plots` (the voting figures) use it; it lives below all three so none imports another
for it.
What it simplifies: no continuity correction; n = 0 gives the whole range (0, 1).
"""

from __future__ import annotations


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (no continuity correction); (0, 1) for n=0.

    scipy's `binomtest(k, n).proportion_ci(method="wilson")` (scipy/stats/_binomtest.py)."""
    from scipy.stats import binomtest

    if n <= 0:
        return 0.0, 1.0
    if not 0 <= k <= n:
        raise ValueError(f"wilson_interval: need 0 <= k <= n, got k={k}, n={n}")
    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)
