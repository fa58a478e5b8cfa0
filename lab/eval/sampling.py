"""Sample tables: completions drawn for a puzzle table and scored by the competition's metric.

`sample_table(gen, puzzles, spec)` runs a `lab.model.generate.Generator` over the puzzles and scores every completion,
giving the one table that evaluation, voting, GRPO pass rates and error analysis read (`SAMPLE_COLUMNS`);
`predictions` is its greedy, one-completion form. With a `cache` file (JSON lines, the `sample_key` first) an
interrupted run resumes where it stopped; cached rows are scored again, never trusted. A puzzle whose prompt leaves
no room under the model's length is skipped (`SKIPPED`, scored wrong), not fatal to the others.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd

from lab.competition.metric import extract_answer, verify
from lab.core.cache import append_log, read_log, write_log
from lab.core.console import Progress
from lab.core.io import atomic_write_csv
from lab.model.generate import Completion, Generator, Sampling, completion_budgets

SKIPPED = "prompt_too_long"  # finish_reason of a puzzle whose prompt cannot fit: not generated, scored wrong

SAMPLE_COLUMNS = ["id", "category", "subtype", "gold", "sample", "completion", "answer", "correct", "tokens",
                  "finish_reason", "mean_logprob"]


def engine_settings(cfg, backend: str) -> dict:
    """The settings besides the sampling spec and the weights that completions depend on: the back-end, dtype, model
    length and every `infer` setting (batch size, metric version, engine). Part of every cache key of generations
    (`sample_key`, `lab.recipes.common.evaluation_key`)."""
    from omegaconf import OmegaConf

    return {"backend": backend, "dtype": cfg.model.dtype, "max_model_len": cfg.model.max_model_len,
            "infer": OmegaConf.to_container(cfg.infer, resolve=True)}


def whole_handover(gen: Generator) -> bool:
    """Whether `sample_table` hands every prompt to the generator in one call: the vllm back-end, whose scheduler
    batches them itself (`generate_vllm`); the hf back-end keeps its chunks (`infer.batch_size` per generate call)."""
    return gen.backend == "vllm"


def sample_key(gen: Generator, spec: Sampling, chunk: int) -> dict:
    """Everything a cached sample table depends on: the sampling spec, the chunk size (chunks are seeded by
    position; 0: every prompt in one hand-over, each request seeded with spec.seed, `whole_handover`),
    `engine_settings` and `Generator.source()`."""
    return {**asdict(spec), "chunk": int(chunk), **engine_settings(gen.cfg, gen.backend), **gen.source()}


def _read_cache(cache: Path, key: dict, n: int) -> dict[str, list[dict]]:
    """The complete puzzles (all n samples) of a cache made with `key` (`lab.core.cache.read_log`); anything else is
    dropped, with a note, and the file is rewritten to hold only what is kept (under a fresh key line)."""
    records, clean = read_log(cache, key, "the samples are drawn afresh")
    done: dict[str, list[dict]] = {}
    for rec in records:
        done.setdefault(str(rec["id"]), []).append(rec)
    partial = [pid for pid, recs in done.items() if sorted(r["sample"] for r in recs) != list(range(n))]
    for pid in partial:
        del done[pid]
    if partial:
        print(f"note: {cache}: {len(partial)} puzzle(s) with fewer than {n} samples written are drawn again",
              flush=True)
    if not (clean and not partial):
        write_log(cache, key, [r for recs in done.values() for r in recs])
    return done


def _rescored(done: dict[str, list[dict]], puzzles: pd.DataFrame, version: str, cache: Path) -> dict:
    """The cached puzzles, verified rather than trusted: a puzzle whose recorded gold is not its answer now is drawn
    again; every kept row's `answer` and `correct` are derived again from its completion (a hand edit of either is
    undone; the completions themselves cannot be checked)."""
    gold = dict(zip(puzzles["id"].astype(str), puzzles["answer"].astype(str))) if "answer" in puzzles else {}
    moved = [pid for pid, recs in done.items() if pid in gold and any(r.get("gold") != gold[pid] for r in recs)]
    for pid in moved:
        del done[pid]
    if moved:
        print(f"note: {cache}: {len(moved)} puzzle(s) whose gold answer differs from the cache's are drawn again",
              flush=True)
    for pid, recs in done.items():
        for r in recs:
            r["answer"] = extract_answer(r.get("completion") or "", version=version)
            r["correct"] = bool(verify(r["gold"], r["answer"], version=version)) if r.get("gold") is not None else None
    return done


def sample_table(gen: Generator, puzzles: pd.DataFrame, spec: Sampling | None = None,
                 cache: str | Path | None = None, chunk: int = 64, progress: bool = True) -> pd.DataFrame:
    """Generate spec.n completions per puzzle and score each; one row per (puzzle, sample).

    `puzzles` needs `id, prompt` and, to score, `answer`; `spec` defaults to `Sampling.competition(cfg)`.
    How prompts reach the generator (`whole_handover`):
    - vllm: every puzzle not yet done in one call, each request seeded with spec.seed (a request's seed drives its
      own sampler, so the samples do not depend on what else is in flight): vLLM's scheduler keeps max_num_seqs
      sequences running to the end instead of waiting, chunk after chunk, for each chunk's longest completion. With
      `cache`, each puzzle's rows are appended as its request finishes, so a killed evaluation keeps every
      finished puzzle, and the rerun hands over only the rest (and samples them as the first run would have);
      without `cache`, one `LLM.generate` call.
    - hf: chunks of `chunk` puzzles, chunk i seeded with spec.seed + its first position, appended chunk by chunk.
    With `cache`, a JSON-lines file whose first line is the `sample_key`, the finished puzzles are skipped when the
    call is repeated with the same key (`_read_cache`: another key starts afresh), their rows scored again
    (`_rescored`). A puzzle whose prompt leaves no room under model.max_model_len is not generated: its rows have
    finish_reason `SKIPPED`, no completion, and count as wrong; a note names its id.
    """
    spec = spec or Sampling.competition(gen.cfg)
    version = gen.cfg.infer.get("metric_version", "final")
    whole = whole_handover(gen)
    done: dict[str, list[dict]] = {}
    if cache is not None:
        cache = Path(cache)
        done = _rescored(_read_cache(cache, sample_key(gen, spec, 0 if whole else chunk), spec.n), puzzles, version,
                         cache)
    todo = puzzles[~puzzles["id"].astype(str).isin(done)]
    t0, new_tokens = time.time(), 0
    bar = Progress("generate", len(puzzles), "puzzles", initial=len(puzzles) - len(todo), enabled=progress)

    def finish(row, comps: list[Completion]) -> None:
        """Score one puzzle's completions, keep them, append them to the cache."""
        nonlocal new_tokens
        gold = str(row["answer"]) if "answer" in row else None
        recs = []
        for j, c in enumerate(comps):
            ans = extract_answer(c.text, version=version)
            recs.append({"id": str(row["id"]), "category": row.get("category", ""), "subtype": row.get("subtype", ""),
                         "gold": gold, "sample": j, "completion": c.text, "answer": ans,
                         "correct": bool(verify(gold, ans, version=version)) if gold is not None else None,
                         "tokens": c.tokens, "finish_reason": c.finish_reason, "mean_logprob": c.mean_logprob})
            new_tokens += c.tokens
        done[recs[0]["id"]] = recs
        if cache is not None:
            append_log(cache, recs)

    # whole: one hand-over (max 1: a cache that holds every puzzle leaves nothing to hand over, and range's step
    # must not be 0)
    for start in range(0, len(todo), max(1, len(todo)) if whole else chunk):
        part = todo.iloc[start:len(todo) if whole else start + chunk]
        rows = [row for _, row in part.iterrows()]
        prompts = gen.prompts(part["prompt"].tolist())
        # per puzzle: one prompt that leaves no room for a completion never stops the others
        room = completion_budgets(gen.tokenizer, prompts, spec.max_tokens, gen.cfg.model.max_model_len)
        fit = [i for i, b in enumerate(room) if b > 0]
        for i in sorted(set(range(len(prompts))) - set(fit)):
            finish(rows[i], [Completion("", 0, SKIPPED)] * spec.n)
        if whole and cache is not None:  # written as each request finishes
            def one(j: int, comps: list[Completion]) -> None:
                finish(rows[fit[j]], comps)
                bar.set(len(done), **{"tok/s": f"{new_tokens / max(time.time() - t0, 1e-9):.0f}"})

            if fit:
                gen.run([prompts[i] for i in fit], spec=spec, progress=False, on_done=one)
            continue
        outs = gen.run([prompts[i] for i in fit], spec=replace(spec, seed=spec.seed + (0 if whole else start)),
                       progress=bar) if fit else []  # whole, no cache: one LLM.generate call
        for i, comps in zip(fit, outs):
            finish(rows[i], comps)
        bar.set(len(puzzles) - len(todo) + start + len(part),  # the hf back-end counted its batches already
                **{"tok/s": f"{new_tokens / max(time.time() - t0, 1e-9):.0f}"})
    bar.close()
    rows = [r for pid in puzzles["id"].astype(str) for r in done.get(pid, [])]
    table = pd.DataFrame(rows, columns=SAMPLE_COLUMNS)
    skipped = list(dict.fromkeys(table.loc[table["finish_reason"] == SKIPPED, "id"]))
    table.attrs["skipped"] = skipped
    if skipped:
        print(f"note: {len(skipped)} of {puzzles['id'].nunique()} puzzle(s) skipped, their prompt leaves no room "
              f"under model.max_model_len={gen.cfg.model.max_model_len} tokens: {', '.join(skipped[:20])}"
              f"{' ...' if len(skipped) > 20 else ''} (scored wrong, finish_reason '{SKIPPED}')", flush=True)
    return table


PREDICTION_COLUMNS = ["id", "category", "subtype", "prompt", "gold", "completion", "answer", "correct", "tokens",
                      "finish_reason"]


def predictions(gen: Generator, puzzles: pd.DataFrame, out_csv: str | Path | None = None,
                cache: str | Path | None = None) -> pd.DataFrame:
    """One completion per puzzle with the competition's settings (greedy), scored; the table error analysis reads."""
    t = sample_table(gen, puzzles, Sampling.competition(gen.cfg), cache=cache)
    t = t.merge(puzzles[["id", "prompt"]].astype({"id": str}), on="id", how="left")[PREDICTION_COLUMNS]
    if out_csv is not None:
        atomic_write_csv(out_csv, t)
    return t
