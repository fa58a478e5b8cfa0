"""04_vote's adapter (the latest finished training stage, or vote.adapter) and early stopping sampled for real
(`lab.eval.vote.early_stop_live`) on a stand-in generator (no model)."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from lab import LabError
from lab.core.config import compose
from lab.core.io import atomic_write_json, atomic_write_text
from lab.eval.vote import early_stop_live, replay

# ---- which adapter 04_vote samples -------------------------------------------------------------------------------


def _finished(run_dir, stage, adapter=True):
    from finished import mark_finished  # tests/finished.py: its manifest, as Stage.finish writes it

    d = run_dir / stage
    if adapter:
        (d / "adapter").mkdir(parents=True)
        (d / "adapter" / "adapter_config.json").write_text("{}")
    atomic_write_json(d / "metrics.json", {"done": True})
    mark_finished(d)
    return d / "adapter"


def test_vote_uses_sfts_adapter_when_grpo_did_not_run(tmp_path):
    from lab.recipes.vote import vote_adapter

    cfg = compose([f"run_dir={tmp_path}"])
    with pytest.raises(LabError, match="no finished training stage"):
        vote_adapter(cfg)
    sft = _finished(tmp_path, "02_sft")
    assert vote_adapter(cfg) == ("02_sft", sft)
    (tmp_path / "03_grpo" / "adapter").mkdir(parents=True)  # a crashed 03_grpo: an adapter but no metrics.json
    assert vote_adapter(cfg) == ("02_sft", sft)
    grpo = tmp_path / "03_grpo" / "adapter"
    (grpo / "adapter_config.json").write_text("{}")
    atomic_write_json(tmp_path / "03_grpo" / "metrics.json", {"done": True})
    assert vote_adapter(cfg) == ("02_sft", sft)  # metrics.json without a finished manifest: not current
    from finished import mark_finished

    mark_finished(tmp_path / "03_grpo")
    assert vote_adapter(cfg) == ("03_grpo", grpo)  # the latest finished stage


def test_an_explicit_vote_adapter_wins(tmp_path):
    from lab.recipes.vote import vote_adapter

    sft = _finished(tmp_path, "02_sft")
    _finished(tmp_path, "03_grpo")
    cfg = compose([f"run_dir={tmp_path}", f"vote.adapter={sft}"])
    assert vote_adapter(cfg) == ("02_sft", sft)
    other = tmp_path.parent / f"{tmp_path.name}_elsewhere"
    cfg = compose([f"run_dir={tmp_path}", f"vote.adapter={other}"])
    assert vote_adapter(cfg) == ("vote.adapter", other)


def test_a_grpo_stage_that_is_no_longer_current_is_passed_over(tmp_path, capsys):
    from lab.recipes.vote import vote_adapter

    sft = _finished(tmp_path, "02_sft")
    _finished(tmp_path, "03_grpo")
    # 03_grpo's manifest recorded an output that has changed since: lineage.problems reports it
    atomic_write_text(tmp_path / "03_grpo" / "manifest.json",
                      '{"stage": "03_grpo", "status": "finished", "outputs": {"metrics.json": "0"}, "inputs": {}}')
    cfg = compose([f"run_dir={tmp_path}"])
    assert vote_adapter(cfg) == ("02_sft", sft)
    assert "03_grpo finished but is not current" in capsys.readouterr().out


# ---- early stopping sampled in rounds ----------------------------------------------------------------------------

SEQ = {  # per puzzle, the answers a sampler would give in order (gold "a")
    "agree": list("aaaaaaaa"),        # stops after the first round
    "split": list("abababab"),        # never agrees: draws all k
    "late": list("bcaaaaaa"),         # stops once a leads by enough
    "none": ["NOT_FOUND"] * 8,        # no real answer: draws all k
}


class FakeSampler:
    """Gives each puzzle the answers of SEQ in order, round after round, with random token counts; records what it
    generated (ids and tokens) per call, and raises after `die_after` calls (a kill)."""

    def __init__(self, seed=0, die_after=None):
        self.rng = random.Random(seed)
        self.calls, self.tokens, self.drawn = [], 0, {i: 0 for i in SEQ}
        self.die_after = die_after

    def __call__(self, ids, rnd, n):
        if self.die_after is not None and len(self.calls) >= self.die_after:
            raise KeyboardInterrupt("killed")
        self.calls.append((list(ids), rnd, n))
        rows = []
        for pid in ids:
            for j in range(n):
                a, t = SEQ[pid][self.drawn[pid]], self.rng.randint(5, 50)
                self.drawn[pid] += 1
                self.tokens += t
                rows.append({"id": pid, "category": "c", "gold": "a", "sample": j, "answer": a, "tokens": t})
        return pd.DataFrame(rows)


@pytest.mark.parametrize("window,opts", [(1, {"agree": None, "stop_prob": 0.9}), (2, {"agree": 1.0}),
                                         (3, {"agree": 0.75})])
def test_live_rounds_stop_early_count_generated_tokens_and_equal_the_replay(window, opts):
    draw = FakeSampler()
    results, samples = early_stop_live(draw, list(SEQ), k=8, window=window, **opts)
    got = results.set_index("id")
    # stops drawing for a puzzle once its answers agree; draws all k where they never do
    # (split: at 7 samples a leads 4 to 3 and one sample cannot overtake it, a tie keeping the class seen first)
    assert got.loc["agree", "samples_used"] < 8 and got.loc["split", "samples_used"] >= 7
    assert got.loc["none", "samples_used"] == 8
    assert got.loc["agree", "samples_used"] == {1: 3, 2: 2, 3: 3}[window]  # stop_prob 0.9: 3 agreeing, P = 15/16
    # the rounds hand over only the open puzzles: the first round all four, then fewer
    assert draw.calls[0][0] == list(SEQ) and "agree" not in draw.calls[-1][0]
    # tokens reported = tokens generated
    assert int(results["tokens_used"].sum()) == draw.tokens == int(samples["tokens"].sum())
    assert results["samples_used"].sum() == len(samples) == sum(draw.drawn.values())
    # the same rule replayed over k samples whose first ones are those drawn (the rest never drawn live, their tokens
    # made up) gives the same answers, samples and tokens: the replay is defined on k samples per puzzle
    rest = pd.DataFrame([{"id": p, "category": "c", "gold": "a", "sample": j, "answer": SEQ[p][j], "tokens": 999}
                         for p in SEQ for j in range(draw.drawn[p], 8)])
    full = pd.concat([samples.drop(columns="round"), rest], ignore_index=True)
    again = replay(full, "early_stop", k=8, window=window, **opts)
    pd.testing.assert_frame_equal(results.reset_index(drop=True), again.reset_index(drop=True))


def test_live_rounds_stop_at_k_and_refuse_a_short_round():
    results, samples = early_stop_live(FakeSampler(), ["split"], k=5, window=2, agree=1.0)
    assert results["samples_used"].tolist() == [5] and list(samples["sample"]) == [0, 1, 2, 3, 4]
    assert list(samples["round"]) == [0, 0, 1, 1, 2]  # the last round asks for only what the budget leaves

    def short(ids, rnd, n):
        return FakeSampler()(ids, rnd, n).groupby("id").head(n - 1)

    with pytest.raises(LabError, match="asked for 2 sample"):
        early_stop_live(short, ["split"], k=4, window=2)
