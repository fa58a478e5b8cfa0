"""04_vote: k samples per held-out puzzle from the latest adapter, every voting method replayed on them, and the
pass@k / maj@k curves that judge them. Kaggle scores one greedy sample; the gap to maj@k is what voting could win.

`vote` runs the steps below in order; notebooks/04_vote.ipynb calls the same steps, one cell each, and draws the
figures they return. Every file of `<run_dir>/04_vote/` is written here."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from lab import LabError
from lab.core import lineage
from lab.core.io import atomic_write_csv
from lab.core.paths import resolve_path
from lab.core.run import Stage, stage_input
from lab.eval import greedy
from lab.recipes import common

TRAINING_STAGES = (("03_grpo", "grpo"), ("02_sft", "sft"))  # latest first: (stage, the config node with adapter_dir)


def vote(stage: Stage) -> dict:
    """The whole stage, step by step (what scripts and the pipeline's headless callers run)."""
    source, adapter = vote_adapter(stage.cfg)
    train, val = common.split(stage)
    with generator(stage, adapter) as gen:
        greedy = greedy_pass(stage, val, adapter, gen)
        samples = sample(stage, val, gen)
        live = early_stop_live(stage, val, gen)
    curves = pass_maj_curves(stage, samples, greedy)
    replayed = [replay(stage, samples, method) for method in stage.cfg.vote.methods]
    methods = methods_table(stage, greedy, replayed, live, curves)
    return vote_finish(stage, source, adapter, greedy, samples, curves, methods, live)


def vote_adapter(cfg) -> tuple[str, Path]:
    """(what it is, path) of the adapter 04_vote samples: `vote.adapter` when set (its stage, if it lies in this run,
    must have finished: `stage_input`), else the latest finished and current training stage's: 03_grpo's, or
    02_sft's when 03_grpo did not finish or is no longer current (02_sft rerun since), with a note saying so."""
    if cfg.vote.adapter:
        p = stage_input(cfg, cfg.vote.adapter)
        try:
            where = lineage.stage_of(p.relative_to(resolve_path(cfg.run_dir)).as_posix()) or "vote.adapter"
        except ValueError:
            where = "vote.adapter"
        print(f"voting with {where}'s adapter ({p})")
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
        path = stage_input(cfg, cfg[node].adapter_dir)
        print(f"voting with {name}'s adapter ({path})")
        return name, path
    raise LabError(f"{run_dir}: no finished training stage (03_grpo or 02_sft) to vote with; run 02_sft first, or "
                   "set vote.adapter=PATH")


def generator(stage: Stage, adapter: Path):
    """The back-end with `adapter` loaded, shared by the greedy pass and the sampling (`close()` it, or use `with`)."""
    from lab.model import generate

    v = stage.cfg.vote
    print(f"k={v.k} samples per puzzle, temperature={v.temperature}")
    return generate.Generator(stage.cfg, adapter=adapter)


def greedy_pass(stage: Stage, val: pd.DataFrame, adapter: Path, gen) -> pd.DataFrame:
    """The competition's one greedy sample per puzzle (`predictions.csv`): the training stage's cached evaluation of
    this adapter when it made one (`lab.eval.greedy`: cached by content), else generated."""
    pred = greedy.evaluate(stage.cfg, val, adapter, stage.path("predictions.csv"), gen=gen)
    print(f"greedy accuracy {float(pred['correct'].mean()):.3f} on {len(pred)} puzzles")
    return pred


def _sampling(stage: Stage):
    from lab.model import generate

    v = stage.cfg.vote
    return generate.Sampling.competition(stage.cfg, n=v.k, temperature=v.temperature, top_p=v.top_p,
                                         logprobs=v.logprobs)


def sample(stage: Stage, val: pd.DataFrame, gen) -> pd.DataFrame:
    """k samples per puzzle at `vote.temperature` (`samples.csv`, one row each; cached in `samples.jsonl` so a killed
    run resumes): every method below is replayed on this one table, so they are compared on equal draws."""
    from lab.eval import sampling

    samples = sampling.sample_table(gen, val, _sampling(stage), cache=stage.path("samples.jsonl"))
    atomic_write_csv(stage.path("samples.csv"), samples)
    print(f"{len(samples)} samples")
    return samples


def early_stop_live(stage: Stage, val: pd.DataFrame, gen) -> pd.DataFrame | None:
    """With `vote.live_early_stop` (and early_stop among the methods): early stopping sampled for real, in rounds
    (`lab.eval.vote.early_stop_live`), so its token saving was generated, not replayed (`early_stop_live.csv`,
    `early_stop_live_samples.csv`). None when off."""
    from lab.eval import sampling
    from lab.eval import vote as vote_lib

    v = stage.cfg.vote
    if not (v.live_early_stop and "early_stop" in v.methods):
        return None
    spec = _sampling(stage)
    opts = {o: x for o, x in dict(v.options.get("early_stop", {})).items() if o in ("window", "agree", "stop_prob")}
    by_id = val.assign(id=val["id"].astype(str)).set_index("id", drop=False)

    def draw(ids, rnd, n):  # round r: its own seed and cache file, so a killed run resumes round by round
        return sampling.sample_table(gen, by_id.loc[ids].reset_index(drop=True),
                                     replace(spec, n=n, seed=spec.seed + 1_000_003 * (rnd + 1)),
                                     cache=stage.path(f"early_stop_round{rnd}.jsonl"))

    live, live_samples = vote_lib.early_stop_live(draw, by_id["id"].tolist(), v.k,
                                                  version=stage.cfg.infer.metric_version, **opts)
    atomic_write_csv(stage.path("early_stop_live.csv"), live)
    atomic_write_csv(stage.path("early_stop_live_samples.csv"), live_samples)
    return live


def pass_maj_curves(stage: Stage, samples: pd.DataFrame, greedy: pd.DataFrame) -> common.Drawn:
    """pass@k and maj@k for k = 1..K against the greedy score (`curves.csv`, `vote_k.png`)."""
    from lab.core import plots
    from lab.eval import vote as vote_lib

    curves = vote_lib.curves(samples, K=stage.cfg.vote.k)
    atomic_write_csv(stage.path("curves.csv"), curves)
    fig = plots.vote_k(curves, greedy=float(greedy["correct"].mean()), n=len(greedy))
    plots.save(fig, stage.path("vote_k.png"))
    return common.Drawn(curves, fig)


def replay(stage: Stage, samples: pd.DataFrame, method: str) -> dict:
    """One voting method (`vote.methods`, its `vote.options`) replayed on the sample table: a row of the methods
    table. early_stop's replayed saving is a what-if: those tokens were generated."""
    from lab.eval import vote as vote_lib

    v = stage.cfg.vote
    s = vote_lib.summary(vote_lib.replay(samples, method, k=v.k, **dict(v.options.get(method, {}))))
    what_if = method == "early_stop"
    return {"method": method + (" (replayed what-if)" if what_if else ""), "accuracy": s["accuracy"],
            "tokens_per_puzzle": s["tokens_used"], "tokens": "replayed what-if" if what_if else "generated"}


def methods_table(stage: Stage, greedy: pd.DataFrame, replayed: list[dict], live: pd.DataFrame | None,
                  curves: common.Drawn) -> common.Drawn:
    """Greedy, every replayed method and live early stopping: accuracy against tokens per puzzle (`methods.csv`,
    `vote_tokens.png`)."""
    from lab.core import plots
    from lab.eval import vote as vote_lib

    rows = [{"method": "greedy (Kaggle)", "accuracy": float(greedy["correct"].mean()),
             "tokens_per_puzzle": float(greedy["tokens"].mean()), "tokens": "generated"}, *replayed]
    if live is not None:
        s = vote_lib.summary(live)
        rows.append({"method": "early_stop (live)", "accuracy": s["accuracy"], "tokens_per_puzzle": s["tokens_used"],
                     "tokens": "generated"})
    methods = pd.DataFrame(rows)
    atomic_write_csv(stage.path("methods.csv"), methods)
    fig = plots.vote_tokens(curves.table, methods, n=len(greedy))
    plots.save(fig, stage.path("vote_tokens.png"))
    return common.Drawn(methods, fig)


def vote_finish(stage: Stage, source: str, adapter: Path, greedy: pd.DataFrame, samples: pd.DataFrame,
                curves: common.Drawn, methods: common.Drawn, live: pd.DataFrame | None) -> dict:
    """metrics.json: the adapter, greedy accuracy, maj@k and pass@k at k, every method's row and live early
    stopping's generated cost against sampling in full; finishes the stage."""
    from lab.eval import vote as vote_lib

    k = stage.cfg.vote.k
    at_k = curves.table.loc[curves.table["k"] == k].iloc[0]
    metrics = {"adapter_stage": source, "adapter": str(adapter), "k": k,
               "greedy_accuracy": float(greedy["correct"].mean()), "maj_at_k": float(at_k["maj_at_k"]),
               "pass_at_k": float(at_k["pass_at_k"]), "methods": methods.table.set_index("method").to_dict("index")}
    if live is not None:
        s, in_full = vote_lib.summary(live), float(samples.groupby("id")["tokens"].sum().mean())
        print(f"early stopping, sampled in rounds: accuracy {s['accuracy']:.3f}, {s['samples_used']:.2f} samples and "
              f"{s['tokens_used']:.0f} tokens per puzzle generated, against {k} samples and {in_full:.0f} tokens "
              "in full")
        metrics["early_stop_live"] = {**s, "tokens_in_full": in_full}
    return stage.finish(metrics)
