"""Voting and generation benchmark on the demo's trained tiny model: `make bench`.

What it measures
  1. Voting, on one fixed sample table. K = 32 completions per held-out puzzle are drawn once
     from the trained adapter (`outputs/demo/03_grpo/adapter`, else `02_sft`'s) with the vote
     settings of that run (temperature, top_p, seed) and per-token log-probabilities, through
     `lab.eval.sampling.sample_table`. The table is cached in `outputs/bench/samples_K32.jsonl`
     (appended chunk by chunk; an interrupted run resumes) and written as `samples_K32.csv`.
     Every method of `lab.eval.vote.METHODS` is then replayed on that table: greedy (the first
     sample), majority (maj@32, the baseline), DeepConf-style confidence weighting for several
     `keep_top` shares, and early stopping for several `window`/`agree` settings. Per method:
     accuracy, its difference from maj@32 in points, tokens per puzzle and their ratio to
     maj@32's, samples drawn, the paired count of puzzles it wins / loses against maj@32, and a
     paired 95% interval for the difference (over the choice of puzzles; the draw of the samples
     adds spread of its own, gauged by maj@16 on samples 0-15 against maj@16 on samples 16-31).
     Also maj@k and pass@k for k = 1..32 (`lab.eval.vote.curves`) and, as the Kaggle reference,
     the accuracy of greedy decoding (temperature 0, one completion, the competition's budget).
  2. A temperature scan: the same K-sample draw at a few more temperatures (`--temperatures`,
     default 0.1 and 0.3, each cached in `<out>/T<t>/`), and per temperature the first sample,
     maj@32, pass@32 and the configured early stop (`vote.options.early_stop`) against maj@32.
     The early-stopping saving depends on how concentrated the samples are, and that is what
     temperature moves; the table shows what each temperature costs in maj@32's lift.
  3. Generation throughput of the hf back-end on the same model: the same prompts, greedy, a
     fixed `max_new_tokens`, once one prompt per `generate` call (batch 1) and once batched
     (default 32 per call); tokens per second and their ratio, plus the share of prompts whose
     batched completion equals the batch-1 one (left padding must not change greedy output).

Output: a printed table, `outputs/bench/vote_bench.json` and `vote_bench.md` (written
atomically). Every figure comes from the run; nothing is hard-coded.

What it simplifies
  * Voting is replayed offline (see `lab.eval.vote`): early stopping's token saving is what a sampler
    drawing `window` samples at a time would get; batched sampling of all 32 at once gets none.
  * One draw of 32 samples per puzzle; maj@k uses the first k. With ~100 held-out puzzles one
    puzzle is one point of accuracy, so differences of a few points are within noise (the
    paired win/loss counts say how many puzzles actually moved).
  * Confidence is the mean token log-probability of a trace (raw model distribution), not
    DeepConf's lowest sliding-window confidence, and there is no online stopping inside a trace.
  * Throughput is the tiny model on CPU with however many threads torch has (the Makefile leaves
    OMP_NUM_THREADS to the caller): it compares batching on this machine, not the GPU or vLLM.
    Tokens counted are completion tokens up to and including end-of-turn; a batch runs until its
    longest member stops, so padding steps cost time but add no tokens. With the vllm back-end
    (`--overrides model.generation_backend=vllm`, GPU) the samples come from vLLM, given the packed
    adapter like every evaluation (`lab.model.generate`), and this throughput part is skipped.

The sample cache is keyed by the adapter's and base model's weight hashes, the held-out split's
hash and the sampling settings (`samples_K32.meta.json`); if any differs it is discarded and
redrawn. Overrides (`--overrides key=value ...`) apply on top of the adapter run's own resolved
config (`<stage>/config.yaml` beside the adapter), e.g. `infer.batch_size=64`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

K = 32
KEEP_TOPS = (1.0, 0.9, 0.5, 0.25, 0.1)
EARLY_STOP = ((1, 1.0), (2, 1.0), (4, 1.0), (8, 1.0), (4, 0.75), (8, 0.75), (8, 0.6))
ADAPTIVE = ((1, 0.9), (1, 0.95), (1, 0.99), (2, 0.95))  # (window, stop_prob): Adaptive-Consistency's Beta stopping rule
CURVE_KS = (1, 2, 4, 8, 16, 32)
SCAN_TEMPERATURES = (0.1, 0.3)  # besides the run's own: how the early-stopping saving moves with the samples' spread
CHUNK = 16  # puzzles per sample_table chunk: the resume granularity; seeds depend on it, so it is in the cache key


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--adapter", help="LoRA adapter folder (default: outputs/demo/03_grpo/adapter, else 02_sft's)")
    p.add_argument("--overrides", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides on top of the adapter run's config, e.g. infer.batch_size=64")
    p.add_argument("--out", default="outputs/bench", help="output folder (relative to the repo root)")
    p.add_argument("--k", type=int, default=K, help="samples per puzzle (default 32)")
    p.add_argument("--tp-prompts", type=int, default=32, help="prompts for the throughput runs")
    p.add_argument("--tp-batch", type=int, default=32, help="prompts per generate() call in the batched run")
    p.add_argument("--tp-max-new-tokens", type=int, default=64, help="fixed completion budget of the throughput runs")
    p.add_argument("--tp-repeats", type=int, default=3, help="timed repeats per setting (median reported)")
    p.add_argument("--temperatures", type=float, nargs="*", default=list(SCAN_TEMPERATURES), metavar="T",
                   help="extra temperatures for the temperature scan, each a K-sample draw of its own "
                        "(default 0.1 0.3; give none to skip)")
    p.add_argument("--skip-throughput", action="store_true", help="only the voting part")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------------------------
# config, adapter, cache key
# ----------------------------------------------------------------------------------------------

def find_adapter(arg: str | None) -> Path | None:
    from lab.core.paths import resolve_path

    if arg:
        return resolve_path(arg)
    for stage in ("03_grpo", "02_sft"):
        p = resolve_path(f"outputs/demo/{stage}/adapter")
        if (p / "adapter_config.json").is_file():
            return p
    return None


def load_config(adapter: Path, overrides: list[str]):
    """The adapter run's resolved config (`<stage>/config.yaml`, typed by lab/core/schema.py) with overrides; else
    compose(overrides)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from lab import LabError
    from lab.core.config import compose, load_saved, schema_problem

    stage_cfg = adapter.parent / "config.yaml"
    if not stage_cfg.is_file():
        return compose(overrides), "compose(overrides)"
    cfg = load_saved(stage_cfg)
    for o in overrides:
        if "=" not in o:
            raise LabError(f"override {o!r} is not KEY=VALUE")
        key, value = o.split("=", 1)
        try:
            OmegaConf.update(cfg, key.lstrip("+"), OmegaConf.from_dotlist([f"v={value}"]).v, merge=True)
        except OmegaConfBaseException as e:
            raise LabError(f"{stage_cfg}: override {o!r}: {schema_problem(e)}") from None
    return cfg, str(stage_cfg)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def folder_hash(folder: Path, pattern: str = "*.safetensors") -> str:
    files = sorted(folder.glob(pattern))
    return hashlib.sha256("".join(f"{f.name}:{file_sha256(f)}" for f in files).encode()).hexdigest()[:16]


def cache_key(cfg, adapter: Path, val, k: int) -> dict:
    from lab.model import models

    return {
        "adapter": str(adapter), "adapter_sha": folder_hash(adapter),
        "base_model": cfg.model.path, "base_model_sha": folder_hash(Path(models.model_path(cfg))),
        "val_ids_sha": hashlib.sha256("\n".join(val["id"].astype(str)).encode()).hexdigest()[:16],
        "val_prompts_sha": hashlib.sha256("\n".join(val["prompt"].astype(str)).encode()).hexdigest()[:16],
        "k": int(k), "temperature": cfg.vote.temperature, "top_p": cfg.vote.top_p,
        "seed": cfg.seed, "max_tokens": cfg.infer.max_tokens, "max_model_len": cfg.model.max_model_len,
        "metric_version": cfg.infer.get("metric_version", "final"), "chunk": CHUNK,
    }


# ----------------------------------------------------------------------------------------------
# sampling
# ----------------------------------------------------------------------------------------------

def sample(gen, val, k: int, out: Path, key: dict) -> tuple[object, dict]:
    """The K-sample table at key["temperature"], drawn once and cached; returns (table, info about this call)."""
    from lab.core.io import atomic_write_csv, atomic_write_json, read_json
    from lab.eval.sampling import sample_table
    from lab.model.generate import Sampling

    out.mkdir(parents=True, exist_ok=True)
    cache, meta, csv = out / f"samples_K{k}.jsonl", out / f"samples_K{k}.meta.json", out / f"samples_K{k}.csv"
    if cache.is_file():
        old = read_json(meta) if meta.is_file() else None
        if old != key:
            changed = sorted(x for x in key if old is None or old.get(x) != key[x])
            print(f"sample cache {cache} was made with other settings ({', '.join(changed)} differ): redrawing")
            cache.unlink()
            csv.unlink(missing_ok=True)
    atomic_write_json(meta, key)
    before = set()
    if cache.is_file():
        for line in cache.read_text(encoding="utf-8").splitlines():
            try:
                before.add(json.loads(line)["id"])
            except (json.JSONDecodeError, KeyError):
                continue
    t0 = time.time()
    spec = Sampling.competition(gen.cfg, n=int(k), temperature=float(key["temperature"]), top_p=float(key["top_p"]),
                                logprobs=True)
    table = sample_table(gen, val, spec, cache=cache,
                         chunk=CHUNK)
    wall = time.time() - t0
    atomic_write_csv(csv, table)
    new = table[~table["id"].isin(before)]
    return table, {"rows": int(len(table)), "rows_drawn_now": int(len(new)), "tokens_drawn_now": int(new["tokens"].sum()),
                   "wall_seconds": round(wall, 1), "cache": str(cache), "csv": str(csv)}


def greedy_reference(gen, val, out: Path, key: dict):
    """Greedy decoding (the competition's setting), cached like the samples."""
    from lab.core.io import atomic_write_json, read_json
    from lab.eval.sampling import predictions

    cache, meta = out / "greedy.jsonl", out / "greedy.meta.json"
    gkey = {x: v for x, v in key.items() if x not in ("k", "temperature")}
    if cache.is_file() and (not meta.is_file() or read_json(meta) != gkey):
        cache.unlink()
    atomic_write_json(meta, gkey)
    return predictions(gen, val, cache=cache)


# ----------------------------------------------------------------------------------------------
# voting
# ----------------------------------------------------------------------------------------------

def vote_rows(samples, k: int, version: str) -> list[dict]:
    from lab.eval import vote

    settings = [("greedy", {}), ("majority", {})]
    settings += [("confidence", {"keep_top": kt}) for kt in KEEP_TOPS]
    settings += [("early_stop", {"window": w, "agree": a}) for w, a in EARLY_STOP]
    settings += [("early_stop", {"window": w, "agree": None, "stop_prob": p}) for w, p in ADAPTIVE]
    missing = sorted(set(vote.METHODS) - {m for m, _ in settings})
    settings += [(m, {}) for m in missing]  # a method added to lab.eval.vote later is still replayed
    results = {}
    for method, opts in settings:
        results[(method, tuple(opts.items()))] = vote.replay(samples, method, k=k, version=version, **opts)
    base = results[("majority", ())]
    return [{"method": method, "options": dict(opts), "label": _label(method, dict(opts), k), **compare(res, base)}
            for (method, opts), res in results.items()]


def compare(res, base) -> dict:
    """A replayed method (`lab.eval.vote.replay` table) against the baseline's replay on the same ids: accuracy, its
    difference in points with a paired 95% half-width, tokens per puzzle and their ratio, samples used, and the
    puzzles it wins / loses."""
    from lab.eval import vote

    s, b = vote.summary(res), vote.summary(base)
    base_ok = base.set_index("id")["correct"].astype(bool)
    ok = res.set_index("id")["correct"].astype(bool).reindex(base_ok.index)
    wins, losses = int((ok & ~base_ok).sum()), int((~ok & base_ok).sum())
    return {"puzzles": s["puzzles"], "accuracy": s["accuracy"], "delta_points": 100.0 * (s["accuracy"] - b["accuracy"]),
            "delta_ci95_points": paired_ci95(wins, losses, s["puzzles"]), "tokens_per_puzzle": s["tokens_used"],
            "token_ratio": s["tokens_used"] / b["tokens_used"] if b["tokens_used"] else math.nan,
            "samples_used": s["samples_used"], "wins": wins, "losses": losses}


def paired_ci95(wins: int, losses: int, n: int) -> float:
    """Half-width, in points, of a normal 95% interval for the paired accuracy difference (W - L) / n.

    Covers the choice of puzzles only, not the randomness of the 32 samples drawn for each.
    """
    if n <= 0:
        return math.nan
    d = (wins - losses) / n
    var = ((wins + losses) / n - d * d) / n
    return 100.0 * 1.96 * math.sqrt(max(var, 0.0))


def _label(method: str, opts: dict, k: int) -> str:
    if method == "greedy":
        return "first sample (T>0)"
    if method == "majority":
        return f"maj@{k}"
    if method == "confidence":
        return f"confidence keep_top={opts['keep_top']:g}"
    if method == "early_stop" and opts.get("stop_prob") is not None:
        return f"early_stop window={opts['window']} stop_prob={opts['stop_prob']:g}"
    if method == "early_stop":
        return f"early_stop window={opts['window']} agree={opts['agree']:g}"
    return method


def scan_row(samples, k: int, version: str, early_stop: dict) -> dict:
    """One temperature's headline figures: one sample's accuracy (`first_sample`: maj@1 of `lab.eval.vote.curves`, the mean
    over all k samples), maj@k, pass@k and the configured early stop against maj@k."""
    from lab.eval import vote

    curve = vote.curves(samples, K=k, version=version).set_index("k")
    maj = vote.replay(samples, "majority", k=k, version=version)
    es = compare(vote.replay(samples, "early_stop", k=k, version=version, **early_stop), maj)
    return {"first_sample": float(curve.loc[1, "maj_at_k"]), "maj_at_k": vote.summary(maj)["accuracy"],
            "pass_at_k": float(curve.loc[k, "pass_at_k"]), "early_stop": dict(early_stop),
            "early_stop_accuracy": es["accuracy"], "early_stop_delta_points": es["delta_points"],
            "early_stop_token_ratio": es["token_ratio"], "early_stop_samples_used": es["samples_used"],
            "wins": es["wins"], "losses": es["losses"]}


# ----------------------------------------------------------------------------------------------
# throughput
# ----------------------------------------------------------------------------------------------

def throughput(model, tokenizer, prompts: list[str], batch: int, max_new_tokens: int, repeats: int) -> dict:
    """hf back-end greedy generation, batch 1 vs `batch` prompts per call: tokens/s and their ratio.

    The two settings alternate within each repeat, so load from other processes hits both alike;
    tokens/s is over the median wall time, the speedup is the median of the per-repeat ratios.
    """
    import torch

    from lab.model.generate import Sampling, generate_hf

    settings = (("batch_1", 1), (f"batch_{batch}", batch))
    generate_hf(model, tokenizer, prompts[:2], Sampling(max_tokens=4), progress=False, batch_size=2)
    walls = {name: [] for name, _ in settings}
    toks, texts = {}, {}
    for _ in range(max(1, repeats)):
        for name, bs in settings:
            t0 = time.perf_counter()
            outs = generate_hf(model, tokenizer, prompts, Sampling(max_tokens=max_new_tokens), progress=False,
                               batch_size=bs)
            walls[name].append(time.perf_counter() - t0)
            toks[name] = sum(c[0].tokens for c in outs)
            texts[name] = [c[0].text for c in outs]
    runs = {name: {"prompts_per_call": bs, "tokens": int(toks[name]), "wall_seconds": [round(w, 3) for w in walls[name]],
                   "tokens_per_second": toks[name] / statistics.median(walls[name])} for name, bs in settings}
    (one, _), (many, _) = settings
    ratios = [(toks[many] / wm) / (toks[one] / w1) for w1, wm in zip(walls[one], walls[many])]
    same = sum(a == b for a, b in zip(texts[one], texts[many]))
    return {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "repeats": max(1, repeats),
            "torch_threads": torch.get_num_threads(), "device": str(next(model.parameters()).device),
            "runs": runs, "speedup": statistics.median(ratios), "speedup_per_repeat": [round(r, 2) for r in ratios],
            "same_completion_share": same / len(prompts)}


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------

def _f(x, spec=".3f"):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def markdown(report: dict) -> str:
    v = report["voting"]
    k = v["k"]
    L = [f"# Vote bench: {report['adapter']}", "",
         f"{v['puzzles']} held-out puzzles, K = {k} samples each at temperature {v['temperature']:g} "
         f"(top_p {v['top_p']:g}, seed {v['seed']}); one puzzle = {100 / max(v['puzzles'], 1):.1f} points. "
         f"Baseline: maj@{k}, accuracy {_f(v['baseline_accuracy'])}, {_f(v['baseline_tokens_per_puzzle'], '.0f')} "
         f"tokens per puzzle. Wins/losses: puzzles the method gets right and maj@{k} wrong, and the reverse; "
         f"± is a paired 95% interval over the choice of puzzles (not over the draw of samples).", "",
         f"| method | accuracy | Δ vs maj@{k} (points) | tokens/puzzle | tokens vs maj@{k} | samples used | wins | losses |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
    rows = [(r["label"], r) for r in v["methods"]]
    if v.get("greedy_decode"):
        rows.append(("greedy decode (T=0, Kaggle)", v["greedy_decode"]))
    for label, r in rows:
        L.append(f"| {label} | {_f(r['accuracy'])} | {r['delta_points']:+.1f} ± {_f(r.get('delta_ci95_points'), '.1f')} "
                 f"| {_f(r['tokens_per_puzzle'], '.0f')} | {_f(r['token_ratio'], '.3f')} | {_f(r['samples_used'], '.1f')} "
                 f"| {r['wins']} | {r['losses']} |")
    sh = v.get("split_half_majority") or {}
    if "second" in sh:
        L += ["", f"Draw noise: maj@{sh['k']} on samples 0-{sh['k'] - 1} scores {_f(sh['first'])}, on samples "
                  f"{sh['k']}-{2 * sh['k'] - 1} {_f(sh['second'])} (same puzzles, same settings, other samples)."]
    scan = v.get("temperature_scan") or []
    if scan:
        es = scan[0]["early_stop"]
        rule = ", ".join(f"{key} {val}" for key, val in es.items())
        L += ["", "## Early stopping against the sampling temperature", "",
              f"The configured early stop ({rule}) against maj@{k}, each temperature its own draw of K = {k} samples "
              f"(greedy decoding: {_f((v.get('greedy_decode') or {}).get('accuracy'))}). The saving depends on how "
              f"concentrated the samples are, which the temperature moves; read it beside what maj@{k} adds over the "
              "first sample at each temperature.", "",
              f"| temperature | first sample | maj@{k} | pass@{k} | early stop | Δ vs maj@{k} (points) | tokens vs maj@{k} "
              "| samples used | wins | losses |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in scan:
            L.append(f"| {r['temperature']:g} | {_f(r['first_sample'])} | {_f(r['maj_at_k'])} | {_f(r['pass_at_k'])} "
                     f"| {_f(r['early_stop_accuracy'])} | {r['early_stop_delta_points']:+.1f} | {_f(r['early_stop_token_ratio'])} "
                     f"| {_f(r['early_stop_samples_used'], '.1f')} | {r['wins']} | {r['losses']} |")
    L += ["", "## maj@k and pass@k (first k of the K samples)", "", "| k | maj@k | pass@k | tokens/puzzle |",
          "|---:|---:|---:|---:|"]
    for c in v["curve"]:
        L.append(f"| {c['k']} | {_f(c['maj_at_k'])} | {_f(c['pass_at_k'])} | {_f(c['tokens_per_puzzle'], '.0f')} |")
    t = report.get("throughput")
    if t:
        L += ["", f"## hf generation throughput ({t['device']}, {t['torch_threads']} torch thread(s))", "",
              f"{t['prompts']} prompts, greedy, max_new_tokens={t['max_new_tokens']}, {t['repeats']} alternating repeats (median).", "",
              "| setting | prompts per call | tokens | median wall (s) | tokens/s |", "|---|---:|---:|---:|---:|"]
        for name, r in t["runs"].items():
            L.append(f"| {name} | {r['prompts_per_call']} | {r['tokens']} | {statistics.median(r['wall_seconds']):.2f} "
                     f"| {r['tokens_per_second']:.1f} |")
        L += ["", f"Batched / batch 1: **{t['speedup']:.2f}x** (median of the per-repeat ratios "
                  f"{', '.join(f'{r:.2f}' for r in t['speedup_per_repeat'])}); completions identical in "
                  f"{100 * t['same_completion_share']:.0f}% of prompts."]
    smp = v["sampling"]
    L += ["", f"Generated {report['finished']} from commit {report['git_commit']}; this run drew {smp['rows_drawn_now']} "
              f"samples ({smp['tokens_drawn_now']} tokens) in {smp['wall_seconds']} s, the rest came from the cache.", ""]
    return "\n".join(L)


def main(argv=None) -> int:
    args = parse_args(argv)
    from lab import LabError

    adapter = find_adapter(args.adapter)
    if adapter is None or not (adapter / "adapter_config.json").is_file():
        where = adapter or "outputs/demo/03_grpo/adapter (or outputs/demo/02_sft/adapter)"
        print(f"vote_bench: no trained adapter at {where}.\n"
              "Run `make demo` first (it trains the tiny model's adapters, ~3 min on 2 CPU cores), "
              "or pass --adapter DIR.", file=sys.stderr)
        return 2
    try:
        return _run(args, adapter)
    except LabError as e:
        print(f"vote_bench: error: {e}", file=sys.stderr)
        return 2


def _run(args, adapter: Path) -> int:
    from omegaconf import OmegaConf

    from lab.data import dataset as data
    from lab.model import generate
    from lab.eval import vote
    from lab.core.io import atomic_write_json, atomic_write_text
    from lab.core.paths import resolve_path
    from lab.core.run import git_commit, hardware, package_versions, seed_everything

    t_start = time.time()
    cfg, cfg_source = load_config(adapter, args.overrides)
    out = resolve_path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seed_everything(cfg.seed)
    _, val = data.prepare(cfg)
    version = cfg.infer.get("metric_version", "final")
    print(f"vote_bench: adapter {adapter} (config: {cfg_source}); {len(val)} held-out puzzles, K={args.k}")

    gen = generate.Generator(cfg, adapter=adapter)
    key = cache_key(cfg, adapter, val, args.k)
    samples, sampling = sample(gen, val, args.k, out, key)
    greedy = greedy_reference(gen, val, out, key)

    rows = vote_rows(samples, args.k, version)
    base = next(r for r in rows if r["method"] == "majority" and not r["options"])
    greedy_row = compare(vote.replay(greedy, "greedy", version=version),
                         vote.replay(samples, "majority", k=args.k, version=version))
    half = args.k // 2
    split_half = {"k": half}
    if half >= 1:
        second = samples[samples["sample"] >= half].assign(sample=lambda d: d["sample"] - half)
        for name, part in (("first", samples[samples["sample"] < half]), ("second", second)):
            split_half[name] = vote.summary(vote.replay(part, "majority", k=half, version=version))["accuracy"]
    curve = vote.curves(samples, K=args.k, version=version)
    curve_rows = curve[curve["k"].isin([k for k in CURVE_KS if k <= args.k] + [args.k])].to_dict("records")
    early_stop = dict(OmegaConf.to_container(cfg.vote.options.early_stop))
    scan = [{"temperature": key["temperature"], **scan_row(samples, args.k, version, early_stop)}]
    for t in sorted(set(args.temperatures) - {key["temperature"]}):
        print(f"temperature scan: K={args.k} samples at temperature {t:g}")
        table, _ = sample(gen, val, args.k, out / f"T{t:g}", {**key, "temperature": float(t)})
        scan.append({"temperature": float(t), **scan_row(table, args.k, version, early_stop)})
    scan.sort(key=lambda r: r["temperature"])

    report = {
        "adapter": str(adapter), "adapter_sha": key["adapter_sha"], "config_source": cfg_source,
        "overrides": list(args.overrides), "git_commit": git_commit(), "packages": package_versions(),
        "hardware": hardware(),
        "voting": {"k": args.k, "puzzles": int(samples["id"].nunique()), "temperature": key["temperature"],
                   "top_p": key["top_p"], "seed": key["seed"], "max_tokens": key["max_tokens"],
                   "metric_version": version, "sampling": sampling,
                   "baseline_accuracy": base["accuracy"], "baseline_tokens_per_puzzle": base["tokens_per_puzzle"],
                   "methods": rows, "greedy_decode": greedy_row, "curve": curve_rows, "split_half_majority": split_half,
                   "temperature_scan": scan,
                   "finish_reasons": samples["finish_reason"].value_counts().to_dict(),
                   "mean_tokens_per_sample": float(samples["tokens"].mean())},
    }
    if not args.skip_throughput and gen.backend != "hf":
        print(f"throughput: measures the hf back-end's batching; skipped with model.generation_backend={gen.backend}")
    elif not args.skip_throughput:
        prompts = gen.prompts(val["prompt"].tolist()[:args.tp_prompts])
        print(f"throughput: {len(prompts)} prompts, batch 1 vs {args.tp_batch}, max_new_tokens={args.tp_max_new_tokens}")
        report["throughput"] = throughput(gen.model, gen.tokenizer, prompts, args.tp_batch, args.tp_max_new_tokens,
                                          args.tp_repeats)
    gen.close()
    report["wall_seconds"] = round(time.time() - t_start, 1)
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    atomic_write_json(out / "vote_bench.json", report)
    md = markdown(report)
    atomic_write_text(out / "vote_bench.md", md)
    print()
    print(md)
    print(f"wrote {out / 'vote_bench.json'} and {out / 'vote_bench.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
