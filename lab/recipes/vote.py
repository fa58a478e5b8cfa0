"""04_vote: voting over sampled completions of the latest adapter, pass@k and maj@k."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lab import LabError
from lab.core import lineage
from lab.core.io import atomic_write_csv
from lab.core.paths import resolve_path
from lab.core.run import Stage, stage_input
from lab.recipes import common


# ---- 04_vote ----------------------------------------------------------------------------------------------------

TRAINING_STAGES = (("03_grpo", "grpo"), ("02_sft", "sft"))  # latest first: (stage, the config node with adapter_dir)


def vote_adapter(cfg) -> tuple[str, Path]:
    """(what it is, path) of the adapter 04_vote samples: `vote.adapter` when set (its stage, if it lies in one of this
    run's, must have finished: `stage_input`), else the latest finished training stage's: 03_grpo's adapter, or
    02_sft's when 03_grpo did not finish (e.g. skipped: its rollouts cost minutes per step). A 03_grpo that
    finished but is no longer current (02_sft rerun since) is passed over for 02_sft, with a note."""
    from lab.core import lineage

    if cfg.vote.adapter:
        p = stage_input(cfg, cfg.vote.adapter)
        try:
            where = lineage.stage_of(p.relative_to(resolve_path(cfg.run_dir)).as_posix()) or "vote.adapter"
        except ValueError:
            where = "vote.adapter"
        return where, p
    run_dir = resolve_path(cfg.run_dir)
    for name, node in TRAINING_STAGES:
        if not (run_dir / name / "metrics.json").is_file():
            if (run_dir / name).is_dir():
                print(f"note: {run_dir / name} has no finished output (no metrics.json): voting with an earlier "
                      "stage's adapter")
            continue
        stale = lineage.problems(run_dir, name)
        if stale:
            print(f"note: {name} finished but is not current ({'; '.join(stale)}): voting with an earlier stage's "
                  "adapter")
            continue
        return name, stage_input(cfg, cfg[node].adapter_dir)
    raise LabError(f"{run_dir}: no finished training stage (03_grpo or 02_sft) to vote with; run 02_sft first, or "
                   "set vote.adapter=PATH")


def vote(stage: Stage) -> dict:
    """Greedy predictions and k samples per held-out puzzle from `vote_adapter` (03_grpo's adapter, else 02_sft's,
    or `vote.adapter`), every voting method of `lab.eval.vote` replayed on that one sample table (accuracy against k
    and against tokens), and with `vote.live_early_stop` early stopping sampled for real
    (`lab.eval.vote.early_stop_live`: its tokens were generated; the replayed early_stop row is the what-if)."""
    from dataclasses import replace

    from lab.data import dataset as data
    from lab.model import generate
    from lab.core import plots
    from lab.eval import sampling
    from lab.eval import vote as vote_lib

    cfg, v = stage.cfg, stage.cfg.vote
    train, val = data.prepare(cfg)
    source, adapter = vote_adapter(cfg)  # its stage must have finished
    print(f"voting with {source}'s adapter ({adapter}): k={v.k}, temperature={v.temperature}")
    live = None
    with generate.Generator(cfg, adapter=adapter) as gen:
        greedy = common.evaluate(stage, val, adapter, "predictions.csv", gen=gen)
        spec = generate.Sampling.competition(cfg, n=v.k, temperature=v.temperature, top_p=v.top_p, logprobs=v.logprobs)
        samples = sampling.sample_table(gen, val, spec, cache=stage.path("samples.jsonl"))
        if v.live_early_stop and "early_stop" in v.methods:
            opts = {o: x for o, x in dict(v.options.get("early_stop", {})).items() if o in ("window", "agree",
                                                                                             "stop_prob")}
            by_id = val.assign(id=val["id"].astype(str)).set_index("id", drop=False)

            def draw(ids, rnd, n):  # round r: its own seed and cache file, so a killed run resumes round by round
                return sampling.sample_table(gen, by_id.loc[ids].reset_index(drop=True),
                                             replace(spec, n=n, seed=spec.seed + 1_000_003 * (rnd + 1)),
                                             cache=stage.path(f"early_stop_round{rnd}.jsonl"))

            live, live_samples = vote_lib.early_stop_live(draw, by_id["id"].tolist(), v.k,
                                                          version=cfg.infer.metric_version, **opts)
            atomic_write_csv(stage.path("early_stop_live.csv"), live)
            atomic_write_csv(stage.path("early_stop_live_samples.csv"), live_samples)
    atomic_write_csv(stage.path("samples.csv"), samples)
    accuracy = float(greedy["correct"].mean())
    print(f"greedy accuracy {accuracy:.3f}; {len(samples)} samples")
    curves = vote_lib.curves(samples, K=v.k)
    atomic_write_csv(stage.path("curves.csv"), curves)
    plots.save(plots.vote_k(curves, greedy=accuracy, n=len(greedy)), stage.path("vote_k.png"))
    rows = [{"method": "greedy (Kaggle)", "accuracy": accuracy, "tokens_per_puzzle": float(greedy["tokens"].mean()),
             "tokens": "generated"}]
    for method in v.methods:
        s = vote_lib.summary(vote_lib.replay(samples, method, k=v.k, **dict(v.options.get(method, {}))))
        what = "replayed what-if" if method == "early_stop" else "generated"  # early_stop's saving is not spent here
        rows.append({"method": method + (" (replayed what-if)" if method == "early_stop" else ""),
                     "accuracy": s["accuracy"], "tokens_per_puzzle": s["tokens_used"], "tokens": what})
    if live is not None:
        s = vote_lib.summary(live)
        rows.append({"method": "early_stop (live)", "accuracy": s["accuracy"], "tokens_per_puzzle": s["tokens_used"],
                     "tokens": "generated"})
        print(f"early stopping, sampled in rounds: accuracy {s['accuracy']:.3f}, {s['samples_used']:.2f} samples and "
              f"{s['tokens_used']:.0f} tokens per puzzle generated, against {v.k} samples and "
              f"{float(samples.groupby('id')['tokens'].sum().mean()):.0f} tokens in full")
    methods = pd.DataFrame(rows)
    atomic_write_csv(stage.path("methods.csv"), methods)
    plots.save(plots.vote_tokens(curves, methods, n=len(greedy)), stage.path("vote_tokens.png"))
    at_k = curves.loc[curves["k"] == v.k].iloc[0]
    metrics = {"adapter_stage": source, "adapter": str(adapter), "k": v.k, "greedy_accuracy": accuracy,
               "maj_at_k": float(at_k["maj_at_k"]), "pass_at_k": float(at_k["pass_at_k"]),
               "methods": methods.set_index("method").to_dict("index")}
    if live is not None:
        metrics["early_stop_live"] = {**vote_lib.summary(live), "tokens_in_full": float(
            samples.groupby("id")["tokens"].sum().mean())}
    return stage.finish(metrics)
