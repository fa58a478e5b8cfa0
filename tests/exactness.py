"""One rule for "the fast path equals the slow path", on any CPU: both measured against an fp64 reference.

A fixed absolute tolerance fails where a CPU's kernels round differently (tests/test_packed_rows.py failed on an AMD
EPYC at 1.43e-5 against 1e-5, while the fp32 slow path was itself 1.02e-5 from fp64). So the candidate (the fast path,
fp32) passes when its error against the fp64 reference is at most

    bound = MULTIPLE x (the fp32 slow path's own error against fp64) + EPS_UNITS x fp32 eps x magnitude

(magnitude: the largest |value| of the fp64 reference, 1 for errors already relative), and a negative control (the
same computation with the mechanism under test removed) must lie at least NEGATIVE_MARGIN x beyond that bound, so the
check can fail. `TABLE` collects every check of the session (tests/conftest.py prints it with -s or on failure).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MULTIPLE = 4.0
EPS_UNITS = 4.0
NEGATIVE_MARGIN = 1000.0
EPS32 = float(torch.finfo(torch.float32).eps)
TABLE: list[Exactness] = []


def _flat(x) -> list[torch.Tensor]:
    if isinstance(x, dict):
        return [torch.as_tensor(x[k]).detach() for k in sorted(x)]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _flat(v)]
    return [torch.as_tensor(x).detach()]


def max_abs(got, ref) -> float:
    """Largest |got - ref| over tensors (or numbers, lists, dicts of them) in float64."""
    return max(float((a.double() - b.double()).abs().max()) for a, b in zip(_flat(got), _flat(ref), strict=True))


def magnitude(ref) -> float:
    return max(float(t.double().abs().max()) for t in _flat(ref))


def max_rel_norm(got: dict, ref: dict) -> float:
    """Largest ||got[k] - ref[k]|| / ||ref[k]|| over the tensors of two dicts with the same keys (gradients)."""
    assert got.keys() == ref.keys(), sorted(set(got) ^ set(ref))
    return max(float((got[k].double() - ref[k].double()).norm() / ref[k].double().norm()) for k in ref)


@dataclass
class Exactness:
    """One check: `err` of the candidate and `ref_err` of the fp32 reference, both against fp64; `negative` the
    negative control's error (None: that test has none)."""

    name: str
    err: float
    ref_err: float
    scale: float
    negative: float | None = None

    @property
    def bound(self) -> float:
        return MULTIPLE * self.ref_err + EPS_UNITS * EPS32 * self.scale

    def line(self) -> str:
        neg = "" if self.negative is None else f", negative {self.negative:.3g} ({self.negative / self.bound:.3g}x)"
        return f"{self.name}: err {self.err:.3g}, fp32 ref err {self.ref_err:.3g}, bound {self.bound:.3g}{neg}"

    def check(self) -> Exactness:
        TABLE.append(self)
        assert self.err <= self.bound, f"not exact: {self.line()}"
        if self.negative is not None:
            assert self.negative >= NEGATIVE_MARGIN * self.bound, f"negative control too close: {self.line()}"
        return self


def check_abs(name: str, got, ref32, ref64, negative=None) -> Exactness:
    """Absolute errors (max |x - ref64|), scaled by the fp64 reference's largest |value|."""
    return Exactness(name, max_abs(got, ref64), max_abs(ref32, ref64), magnitude(ref64),
                     None if negative is None else max_abs(negative, ref64)).check()


def check_rel(name: str, got: dict, ref32: dict, ref64: dict, negative: dict | None = None) -> Exactness:
    """Per-tensor relative norms (gradients), the worst tensor counted; the scale is 1."""
    return Exactness(name, max_rel_norm(got, ref64), max_rel_norm(ref32, ref64), 1.0,
                     None if negative is None else max_rel_norm(negative, ref64)).check()
