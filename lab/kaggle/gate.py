"""The pre-submission gate: serve a submission.zip with vLLM as the scorer does and show that it changes the output.

`python -m lab gate ZIP --model PATH [--n N] [--data CSV]` (docs/vllm_lane.md, "The gate"):
1. `lab.model.submission.check` on the zip against the base model at PATH; any problem stops here.
2. One vLLM engine on PATH with the scorer's settings, the zip served exactly as `lab.model.generate` serves it.
3. Greedy completions for N puzzles without and with the adapter: accuracy under the competition metric, the share
   cut off at the completion budget, the puzzles that changed.
4. Each LoRA family in the zip served alone (a copy holding only its tensors): it "reaches the output" when, over
   the first FIRST_TOKENS greedy tokens of the first REACH_PROMPTS puzzles, one of the TOP log-probabilities moves by
   more than REACH against the base model or a token changes. The full adapter is measured the same way.
5. The verdict: REFUSED (exit 1) when the adapter changes nothing (vLLM serves the base model); FAIL (exit 1) when a
   family does not reach the output; else PASS (exit 0).
On a GPU this is the real pre-submission check; without CUDA it runs vLLM's CPU build on the tiny model through the
same code, with the test-only expert-matmul stand-in of `lab.model.vllm_cpu` (the gate says so). Why generated
tokens rather than prompt log-probabilities, and what it simplifies: docs/internals.md, lab.kaggle.gate.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path

from lab import LabError

FIRST_TOKENS = 8   # generated tokens whose log-probabilities the family check compares
TOP = 5            # log-probabilities of the TOP most likely tokens at each of them
REACH = 1e-3       # a family reaches the output when some log-probability moves by more than this (or a token changes)
REACH_PROMPTS = 16


def family_copies(adapter_dir: Path, workdir: Path) -> dict[str, Path]:
    """family -> a folder holding adapter_config.json and only that family's tensors of `adapter_dir`."""
    from safetensors.torch import load_file, save_file

    from lab.model.lora import family_of
    from lab.model.submission import CONFIG_NAME, WEIGHTS_NAME

    by_family: dict[str, dict] = {}
    for name, t in load_file(str(adapter_dir / WEIGHTS_NAME)).items():
        fam = family_of(name)
        if fam is None:
            raise LabError(f"{adapter_dir / WEIGHTS_NAME}: tensor {name} is not a LoRA tensor")
        by_family.setdefault(fam, {})[name] = t
    out = {}
    for fam, part in sorted(by_family.items()):
        d = workdir / f"only_{fam.replace('.', '_')}"
        d.mkdir(parents=True)
        save_file(part, str(d / WEIGHTS_NAME))
        (d / CONFIG_NAME).write_bytes((adapter_dir / CONFIG_NAME).read_bytes())
        out[fam] = d
    return out


def _puzzles(n: int, data: str | None):
    import pandas as pd

    if data:
        from lab.competition.metric import read_table

        t = read_table(data, ["id", "prompt", "answer"], "puzzles")
        return t.head(n).reset_index(drop=True)
    from lab.puzzles.categories import CATEGORIES
    from lab.puzzles.generate import generate

    per = math.ceil(n / len(CATEGORIES))
    frames = pd.concat([generate(c, per, seed=0) for c in CATEGORIES])
    return frames.sort_index(kind="stable").head(n).reset_index(drop=True)  # round-robin over the categories


def gate_config(model: str):
    """The config the gate runs with: the real model's on a GPU, the tiny model's on CPU; model.path = `model`."""
    import torch

    from lab.core.config import compose

    group = "nemotron_nano" if torch.cuda.is_available() else "tiny"
    return compose([f"model={group}", f"model.path={Path(model).resolve()}", "model.build_tiny=false",
                    "model.generation_backend=vllm"])


def first_tokens(llm, prompts: list[str], lora_request) -> list[tuple[list[int], list[dict]]]:
    """Per prompt, the first FIRST_TOKENS greedy token ids and, at each, the log-probabilities of the TOP most
    likely tokens ({id: logprob}; raw model log-probabilities, before sampling)."""
    from vllm import SamplingParams

    outs = llm.generate(prompts, SamplingParams(max_tokens=FIRST_TOKENS, temperature=0.0, logprobs=TOP),
                        lora_request=lora_request, use_tqdm=False)
    res = []
    for o in outs:
        c = o.outputs[0]
        res.append((list(c.token_ids), [{t: lp.logprob for t, lp in step.items()} for step in c.logprobs]))
    return res


def reach(base: list, other: list) -> tuple[float, int]:
    """(largest change of a log-probability the two share, prompts whose first tokens changed); positions are
    compared while the context is the same (up to and including the first token that differs)."""
    largest, changed = 0.0, 0
    for (ids_a, steps_a), (ids_b, steps_b) in zip(base, other):
        for i, (sa, sb) in enumerate(zip(steps_a, steps_b)):
            largest = max([largest] + [abs(sa[t] - sb[t]) for t in sa.keys() & sb.keys()])
            if ids_a[i] != ids_b[i]:
                changed += 1
                break
    return largest, changed


def gate(zip_path: str, model: str, n: int = 64, data: str | None = None, log=print) -> dict:
    """Run the gate (module docstring); returns the report and prints it with `log`."""
    import os

    import torch

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # the report, not vLLM's start-up log (read at import)

    from lab.model import generate, submission
    from lab.competition.metric import score

    zip_path = Path(zip_path)
    problems = submission.check(zip_path, base_model=model)
    if problems:
        raise LabError(f"{zip_path}: `lab.model.submission.check` refuses it, so no engine is started:\n  - "
                       + "\n  - ".join(problems))
    cfg = gate_config(model)
    if not torch.cuda.is_available():
        from lab.model import vllm_cpu

        vllm_cpu.cpu_environment()
        vllm_cpu.install_expert_matmul_standin()
        log("note: no CUDA: vLLM's CPU build with lab.model.vllm_cpu's TEST-ONLY stand-in for the routed-expert matmul")
    from vllm.lora.request import LoRARequest

    from lab.model.models import load_tokenizer
    from lab.competition.prompts import chat_prompt

    t0 = time.time()
    puzzles = _puzzles(n, data)
    tok = load_tokenizer(cfg)
    prompts = [chat_prompt(tok, p) for p in puzzles["prompt"]]
    inf = cfg.infer
    budget = generate.completion_budget(tok, prompts, inf.max_tokens, cfg.model.max_model_len)
    version = inf.metric_version
    report: dict = {"zip": str(zip_path), "model": model, "puzzles": len(prompts), "budget": budget,
                    "device": "cuda" if torch.cuda.is_available() else "cpu"}
    with tempfile.TemporaryDirectory(prefix="lab_gate_") as work:
        work = Path(work)
        full = generate.served_adapter(zip_path, work)
        copies = family_copies(full, work)
        requests = {"adapter": LoRARequest(lora_name="adapter", lora_int_id=1, lora_path=str(full))}
        for i, (fam, d) in enumerate(copies.items()):
            requests[fam] = LoRARequest(lora_name=f"only_{fam}", lora_int_id=i + 2, lora_path=str(d))
        llm = generate.vllm_engine(cfg, str(Path(model).resolve()))
        try:
            runs = {}
            # the base's first tokens before any adapter is loaded: vllm-cpu 0.32.0 keeps applying a loaded lm_head
            # LoRA to later requests that carry none (seen here: base requests after one lm_head-only request came
            # out as that adapter's), so a base measured afterwards would hide the lm_head family
            few = prompts[:REACH_PROMPTS]
            base_first = first_tokens(llm, few, None)
            for label, req in (("base", None), ("adapter", requests["adapter"])):
                outs = generate.generate_vllm(llm, prompts, generate.Sampling.competition(cfg, max_tokens=budget),
                                              lora_request=req)
                runs[label] = comps = [o[0] for o in outs]
                report[label] = {"accuracy": score(puzzles["answer"], [c.text for c in comps], version),
                                 "truncated": sum(c.finish_reason == "length" for c in comps) / len(comps)}
            report["completions_changed"] = sum(a.token_ids != b.token_ids
                                                for a, b in zip(runs["base"], runs["adapter"]))
            # the family check: the first greedy tokens' log-probabilities under each single-family copy
            report["reach_prompts"] = len(few)
            report["max_logprob_change"], report["first_tokens_changed"] = {}, {}
            for label, req in requests.items():
                largest, changed = reach(base_first, first_tokens(llm, few, req))
                report["max_logprob_change"][label], report["first_tokens_changed"][label] = largest, changed
        finally:
            generate.close_engine(llm)
            del llm
    moved = {k: v > REACH or report["first_tokens_changed"][k] > 0 for k, v in report["max_logprob_change"].items()}
    report["reaches_output"] = moved
    silent = [f for f in copies if not moved[f]]
    if not moved["adapter"] and report["completions_changed"] == 0:
        verdict, why = "REFUSED", ("the adapter changes nothing: vLLM serves the base model's log-probabilities and "
                                   "completions (does it target modules vLLM applies a LoRA to?)")
    elif silent:
        verdict, why = "FAIL", f"families whose delta does not reach the output: {', '.join(silent)}"
    else:
        verdict, why = "PASS", "every LoRA family in the zip changes the served log-probabilities"
    report.update(verdict=verdict, why=why, seconds=round(time.time() - t0, 1))
    log(render(report))
    return report


def render(r: dict) -> str:
    lines = [f"gate: {r['zip']} on {r['model']} ({r['device']}), {r['puzzles']} puzzles, greedy, completion "
             f"budget {r['budget']} tokens",
             "",
             "| | accuracy | truncated |",
             "|---|---|---|"]
    for label in ("base", "adapter"):
        lines.append(f"| {'without' if label == 'base' else 'with'} the adapter | {r[label]['accuracy']:.3f} | "
                     f"{r[label]['truncated']:.3f} |")
    lines += ["", f"completions changed by the adapter: {r['completions_changed']} of {r['puzzles']}", "",
              f"| LoRA family (served alone) | max change of a log-probability, first {FIRST_TOKENS} tokens | "
              f"puzzles whose first {FIRST_TOKENS} tokens changed (of {r['reach_prompts']}) | reaches the output |",
              "|---|---|---|---|"]
    for label, v in r["max_logprob_change"].items():
        lines.append(f"| {'whole adapter' if label == 'adapter' else label} | {v:.3g} | "
                     f"{r['first_tokens_changed'][label]} | {'yes' if r['reaches_output'][label] else 'NO'} |")
    lines += ["", f"verdict: {r['verdict']}: {r['why']} ({r['seconds']} s)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m lab gate ZIP --model DIR [--n N] [--data CSV] [--json PATH]`: exit 0 on PASS."""
    import argparse

    g = argparse.ArgumentParser(prog="python -m lab gate",
                                description="serve ZIP with vLLM as the scorer does: accuracy with and without it, "
                                            "and whether each LoRA family reaches the output; exit 0 on PASS")
    g.add_argument("zip")
    g.add_argument("--model", required=True, help="the base model folder vLLM loads")
    g.add_argument("--n", type=int, default=64, help="puzzles to generate for")
    g.add_argument("--data", help="CSV of puzzles (id, prompt, answer); default: generated ones")
    g.add_argument("--json", help="also write the report to this JSON file (a new file)")
    g.add_argument("--force", action="store_true", help="replace --json PATH when it exists")
    args = g.parse_args(argv)
    from lab.core import owner

    inputs = (args.zip, args.model, args.data)
    out_json = owner.output_file(args.json, "gate --json", args.force, inputs) if args.json else None
    r = gate(args.zip, args.model, n=args.n, data=args.data)
    if args.json:
        from lab.core.io import atomic_write_text

        atomic_write_text(out_json, json.dumps(r, indent=1))
    return 0 if r["verdict"] == "PASS" else 1
