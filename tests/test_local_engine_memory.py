"""Local evaluation on a card where the scorer's gpu_memory_utilization leaves no room for the cache (issue 26,
item 7): `infer.local_gpu_memory_utilization` sets the share of the lab's own vLLM engines; the scorer's value, what
the competition's (`cfg.competition`, what the submission's checks read), does not change. vLLM is a test-only stand-in that records
the engine's keyword arguments (no GPU here)."""

from __future__ import annotations

import sys
import types

import pytest

from lab.core import config
from lab.model import generate
from lab import LabError


def _engine_kwargs(monkeypatch, cfg) -> dict:
    seen = {}

    class LLM:
        def __init__(self, **kw):
            seen.update(kw)

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    generate.vllm_engine(cfg, "some/model")
    return seen


def test_the_scorer_share_by_default_and_the_local_one_when_set(monkeypatch):
    cfg = config.compose(["experiment=competition"])
    assert cfg.infer.local_gpu_memory_utilization is None
    assert _engine_kwargs(monkeypatch, cfg)["gpu_memory_utilization"] == 0.85
    local = config.compose(["experiment=competition", "infer.local_gpu_memory_utilization=0.95"])
    assert _engine_kwargs(monkeypatch, local)["gpu_memory_utilization"] == 0.95
    assert local.infer.gpu_memory_utilization == local.competition.gpu_memory_utilization == 0.85


@pytest.mark.parametrize("value", [0, 1.2])
def test_a_share_outside_0_1_is_refused_at_compose(value):
    with pytest.raises(LabError, match=rf"infer.local_gpu_memory_utilization={float(value)} must be"):
        config.compose(["experiment=competition", f"infer.local_gpu_memory_utilization={value}"])
