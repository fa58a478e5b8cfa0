"""GRPO rollouts from the served adapter: `VLLMRollouts`, TRL's `rollout_func` for `grpo.rollout_backend=vllm`.

TRL 1.15's `GRPOTrainer(rollout_func=...)` (trl/trainer/grpo_trainer.py, `_generate`) calls `rollout_func(prompts,
trainer)` once per generation round with this process's slice of the generation batch (the prompts as the dataset
holds them, each one repeated `num_generations` times in a row by TRL's `RepeatSampler`) and takes back a dict with
`prompt_ids`, `completion_ids` and `logprobs` (one entry per prompt entry, in order); other keys go to the reward
functions. TRL's own `use_vllm` stays off: it would feed its engine merged weights (`lab.plan.preflight.check_backend`).

One round (`VLLMRollouts.__call__`):
1. pack: the trainer's in-memory "default" adapter is saved (`save_pretrained`, that adapter only) and packed and
   unzipped exactly as the evaluations serve an adapter (`lab.model.generate.served_adapter`: `lab.model.submission.pack`,
   the submission's own packing and `check`), into `<checkpoint_dir>/rollouts/step<global step>-<lora checksum>`,
   written atomically (`lab.core.io.atomic_dir`) and keyed by what produced it (the step and the weights' checksum:
   a rerun reuses a folder only for the same weights); older round folders are removed, the last two kept;
2. switch (CUDA with `grpo.vllm_sleep_mode`, else nothing): the training model's frozen parameters go to CPU memory
   and the engine wakes up (`wake`); after sampling it sleeps and the frozen parameters come back (`engine_phase`).
   Level 1 (`LLM.sleep(level=1)`: weights to CPU memory, KV cache freed; vllm/entrypoints/llm.py) needs the host to
   hold the weights twice at a switch; level 2 discards them and reloads them from the model folder at wake-up
   (`collective_rpc("reload_weights")`), holding them once (`grpo.vllm_sleep_level`, null: chosen from the host's
   memory by `lab.plan.memory.sleep_level`);
3. load: a `LoRARequest` with a fresh `lora_int_id` per round (vLLM caches adapters by id), loaded up front
   (`LLMEngine.add_lora`, vllm/v1/engine/llm_engine.py) so its time is its own; the previous round's id is removed;
4. sample: one hand-over of the round's distinct prompts to the engine (`lab.model.generate.generate_vllm`), n =
   num_generations, temperature and top_p from conf/grpo (top_k off, as `grpo_args` sets TRL's), max_tokens = the
   GRPO budget (TRL's `max_completion_length`), one seed per group (cfg.seed + n x the group's running index over the
   run, so no two groups share a seed); the prompt token ids are TRL's own tokenisation of the prompt
   (`lab.train.trl_private.prompt_ids`), handed to vLLM as token ids, so the trainer scores exactly the ids sampled;
   `logprobs` are the sampled tokens' log-probabilities after temperature (the engine runs with
   `logprobs_mode="processed_logprobs"`, as TRL's own vLLM engine does), the quantity TRL's trainer computes.
Each part's seconds go to TRL's metrics (`rollout/pack_s`, `rollout/switch_s`, `rollout/load_s`, `rollout/sample_s`)
and to `self.rounds` (one dict per round). Where TRL computes the old log-probabilities (policy lag,
`grpo.steps_per_generation` > 1) `rollout/logp_diff_mean` / `_max` log |vLLM's - the trainer's| over the completion
tokens (`lab.train.trl_private.watch_sampling_gap`).

Policy lag. With `grpo.steps_per_generation` = S > 1 one round feeds S optimiser steps; TRL then computes
`old_per_token_logps` (its `gradient_accumulation_steps % (steps_per_generation x num_iterations) != 0`,
`_generate_and_score_completions`) and its clipped ratio corrects the later steps (`lab.plan.memory.micro_batch`).
TRL's vLLM importance-sampling correction (`vllm_importance_sampling_correction`) runs only with its `use_vllm`, so
the sampler-vs-trainer difference (bf16 kernels on a GPU) is measured, not corrected.

Pass rates: `pass_rate_generator()` serves the start adapter (packed the same way, round "start") from the same engine
as a `lab.model.generate.Generator`, so `lab.train.grpo.pass_rate_table`'s per-prompt cache works as for evaluations.

What it simplifies: one process (one GPU); the engine is built once, at the first use; the frozen parameters move
one by one (no pinned staging buffer); the old LoRA id is removed before the new one is added (one adapter slot).
Not run on a GPU: the switch (sleep mode, moving parameters) runs only with CUDA and is untested; on CPU it is a no-op.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import time
from pathlib import Path

from lab import LabError
from lab.core.io import atomic_dir
from lab.model import generate
from lab.model.submission import pack_dtype
from lab.train import trl_private

ROUND_DIRS_KEPT = 2  # round folders kept on disk (the one being served and the one before)


def wake(llm, level: int, timings: dict) -> None:
    """Wake the engine from `llm.sleep(level)`. Level 1: `wake_up()` (its weights come back from CPU memory). Level 2
    (its weights were discarded): the weights' memory back (`wake_up(tags=["weights"])`), the weights reloaded from
    the model folder (`collective_rpc("reload_weights")`: vllm/v1/worker/gpu_worker.py `reload_weights`, which
    also resets the engine's LoRA state, so the round's adapter is added after this), then the KV cache
    (`wake_up(tags=["kv_cache"])`). vllm/entrypoints/llm.py: sleep levels 1 and 2, wake_up tags."""
    if level == 2:
        llm.wake_up(tags=["weights"])
        t = time.perf_counter()
        llm.collective_rpc("reload_weights")
        timings["reload_s"] = timings.get("reload_s", 0.0) + time.perf_counter() - t
        llm.wake_up(tags=["kv_cache"])
    else:
        llm.wake_up()


@contextlib.contextmanager
def engine_phase(model, llm, switch: bool, timings: dict | None = None, level: int = 1):
    """The engine's turn on the card: with `switch` (CUDA, sleep mode), the model's frozen (requires_grad=False)
    CUDA parameters move to CPU and the engine wakes (`wake`); on exit `llm.sleep(level)` and the parameters move
    back. Without `switch`, nothing moves. The seconds spent go to timings["switch_s"] (added; a level-2 reload
    also to timings["reload_s"])."""
    if timings is None:
        timings = {}
    timings.setdefault("switch_s", 0.0)
    if not switch:
        yield
        return
    import torch

    t = time.perf_counter()
    moved = [(p, p.device) for p in model.parameters() if not p.requires_grad and p.device.type == "cuda"]
    for p, _ in moved:
        p.data = p.data.to("cpu")
    torch.cuda.empty_cache()
    wake(llm, level, timings)
    timings["switch_s"] += time.perf_counter() - t
    try:
        yield
    finally:
        t = time.perf_counter()
        llm.sleep(level=level)
        for p, dev in moved:
            p.data = p.data.to(dev)
        torch.cuda.synchronize()
        timings["switch_s"] += time.perf_counter() - t


def groups(prompts: list, n: int) -> list:
    """The distinct prompt of each group of `n` consecutive entries (TRL's RepeatSampler repeats each prompt n times
    in a row); a LabError if the slice is not made of such groups."""
    if n < 1 or len(prompts) % n:
        raise LabError(f"rollouts: {len(prompts)} prompts do not split into groups of num_generations={n}")
    out = []
    for i in range(0, len(prompts), n):
        if any(p != prompts[i] for p in prompts[i:i + n]):
            raise LabError("rollouts: TRL handed over a group whose num_generations prompts differ; expected each "
                           "prompt repeated num_generations times in a row (trl/trainer/grpo_trainer.py RepeatSampler)")
        out.append(prompts[i])
    return out


class VLLMRollouts:
    """TRL `rollout_func` sampling from the served adapter (module docstring). `model` is the PEFT model being
    trained, `workdir` the run's checkpoint folder (round folders go under `workdir/rollouts`), `budget` the GRPO
    completion budget. `engine` is built at first use unless handed in (tests)."""

    def __init__(self, cfg, model, tokenizer, workdir: str | Path, budget: int, engine=None):
        import torch

        self.cfg, self.model, self.tokenizer, self.budget = cfg, model, tokenizer, int(budget)
        self.dir = Path(workdir) / "rollouts"
        self.llm = engine
        self.cuda = torch.cuda.is_available()
        self.switch = self.cuda and bool(cfg.grpo.vllm_sleep_mode)
        self.pack_dtype = pack_dtype(cfg)
        self.level = 1
        if self.switch:  # how the engine sleeps between rounds, from the host's memory (lab.plan.memory.sleep_level)
            from lab.plan.memory import sleep_level

            self.level, why = sleep_level(cfg)
            print(f"rollout engine sleeps at level {self.level}: {why}", flush=True)
        self._ids = itertools.count(1)
        self.lora = None  # the LoRARequest being served
        self.rounds: list[dict] = []  # per round: step, lora_int_id, folder, seconds per part, sequences

    # ---- the engine and the adapter --------------------------------------------------------------------------

    def _engine(self, timings: dict):
        """Build the engine once (in the engine's phase: on CUDA the caller has moved the frozen weights out)."""
        if self.llm is None:
            from lab.model import models

            t = time.perf_counter()
            g = self.cfg.grpo
            share = g.vllm_gpu_memory_utilization
            if share is None:  # the card less what the trainer keeps on it while the engine samples
                from lab.plan.memory import engine_share

                share = engine_share(self.cfg)
            timings["engine_share"] = float(share)
            seqs = g.max_num_seqs
            if seqs is None and self.cuda:  # null: as many as the engine's share holds (lab.plan.memory)
                from lab.plan.memory import rollout_seqs

                seqs = rollout_seqs(self.cfg)
            timings["max_num_seqs"] = int(seqs or self.cfg.infer.max_num_seqs)
            self.llm = generate.vllm_engine(self.cfg, models.model_path(self.cfg), max_num_seqs=seqs,
                                            gpu_memory_utilization=float(share),
                                            enable_sleep_mode=self.switch, logprobs_mode="processed_logprobs")
            timings["engine_start_s"] = time.perf_counter() - t
        return self.llm

    def pack(self, key: str) -> Path:
        """The in-memory "default" adapter as vLLM serves it (`generate.served_adapter`), in
        `rollouts/<key>-<checksum>`: written atomically, reused when it exists (same key, same weights)."""
        sha = generate.lora_checksum(self.model, trainable=True)[:16]
        folder = self.dir / f"{key}-{sha}"
        if (folder / "adapter" / "adapter_config.json").is_file():
            return folder / "adapter"
        self.dir.mkdir(parents=True, exist_ok=True)
        with atomic_dir(folder, "rollout adapter") as tmp:
            # only the trained adapter: TRL's "ref" copy (beta > 0) is not served
            self.model.save_pretrained(str(tmp / "peft"), selected_adapters=["default"], save_embedding_layers=False)
            generate.served_adapter(tmp / "peft", tmp, dtype=self.pack_dtype)
            shutil.rmtree(tmp / "peft")
            (tmp / "adapter.zip").unlink(missing_ok=True)
        for old in sorted((p for p in self.dir.iterdir() if p.is_dir() and p != folder and "-" in p.name),
                          key=lambda p: p.stat().st_mtime)[:-(ROUND_DIRS_KEPT - 1) or None]:
            shutil.rmtree(old, ignore_errors=True)
        return folder / "adapter"

    def _serve(self, path: Path, name: str):
        """A fresh LoRARequest for `path`, loaded into the engine now; the previous one removed."""
        from vllm.lora.request import LoRARequest

        engine = self.llm.llm_engine
        if self.lora is not None:
            engine.remove_lora(self.lora.lora_int_id)
        self.lora = LoRARequest(lora_name=name, lora_int_id=next(self._ids), lora_path=str(path))
        engine.add_lora(self.lora)
        return self.lora

    def _round(self, key: str, work):
        """pack, switch, engine, load, `work()`, switch back; returns (work's result, timings)."""
        timings = {}
        t = time.perf_counter()
        path = self.pack(key)
        timings["pack_s"] = time.perf_counter() - t
        with engine_phase(self.model, self.llm if self.llm is not None else _Lazy(self), self.switch, timings,
                          self.level):
            self._engine(timings)
            t = time.perf_counter()
            self._serve(path, key)
            timings["load_s"] = time.perf_counter() - t
            t = time.perf_counter()
            out = work()
            timings["sample_s"] = time.perf_counter() - t
        return out, timings, path

    # ---- TRL's rollout_func ----------------------------------------------------------------------------------

    def __call__(self, prompts: list, trainer) -> dict:
        n = int(trainer.num_generations)
        distinct = groups(list(prompts), n)
        ids = trl_private.prompt_ids(trainer, distinct)  # TRL's own tokenisation of these prompts
        step = int(trainer.state.global_step)
        first = step * int(self.cfg.grpo.prompts_per_step)  # groups before this round (prompts_per_step per step)
        g = self.cfg.grpo
        spec = generate.Sampling(max_tokens=int(trainer.max_completion_length), n=n, temperature=float(g.temperature),
                                 top_p=float(g.top_p), seed=int(self.cfg.seed), logprobs=True)
        seeds = [int(self.cfg.seed) + n * (first + i) for i in range(len(distinct))]

        def work():
            return generate.generate_vllm(self.llm, [{"prompt_token_ids": list(x)} for x in ids], spec,
                                          progress=False, lora_request=self.lora, seeds=seeds)

        outs, timings, path = self._round(f"step{step:06d}", work)
        prompt_ids, completion_ids, logprobs = [], [], []
        for pid, comps in zip(ids, outs):
            if len(comps) != n:
                raise RuntimeError(f"rollouts: vLLM returned {len(comps)} completions for a prompt, not {n}")
            for c in comps:
                prompt_ids.append(list(pid))
                completion_ids.append(list(c.token_ids))
                logprobs.append(list(c.logprobs))
        record = {"step": step, "lora_int_id": self.lora.lora_int_id, "folder": str(path.parent),
                  "sequences": len(completion_ids), **{k: round(v, 4) for k, v in timings.items()}}
        self.rounds.append(record)
        for k in ("pack_s", "switch_s", "reload_s", "load_s", "sample_s", "engine_start_s", "engine_share",
                  "max_num_seqs"):
            if k in timings:
                trl_private.log_metric(trainer, f"rollout/{k}", float(timings[k]))
        print(f"rollout round at step {step}: {len(distinct)} prompts x {n}, lora id {self.lora.lora_int_id}; "
              + ", ".join(f"{k} {v:.2f}" for k, v in timings.items()), flush=True)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    # ---- pass rates ------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def pass_rate_generator(self):
        """A `Generator` on this engine serving the start adapter (round "start"), in the engine's phase; its
        `source()` names the base model and the in-memory adapter's checksum (the pass-rate cache's key)."""
        from lab.model import models

        timings = {}
        t = time.perf_counter()
        path = self.pack("start")
        timings["pack_s"] = time.perf_counter() - t
        base = models.model_path(self.cfg)
        source = {"model": base, "model_sha256": generate.model_hash(base), "weights": "in memory, served packed",
                  "lora_sha256": generate.lora_checksum(self.model)}
        with engine_phase(self.model, self.llm if self.llm is not None else _Lazy(self), self.switch, timings,
                          self.level):
            self._engine(timings)
            self._serve(path, "start")
            yield generate.Generator.serving(self.cfg, self.llm, self.tokenizer, self.lora, source)

    def open(self):
        """Build the engine now (else the first round or pass-rate call does), in the engine's phase; returns it."""
        timings = {}
        with engine_phase(self.model, self.llm if self.llm is not None else _Lazy(self), self.switch, timings,
                          self.level):
            self._engine(timings)
        return self.llm

    def close(self) -> None:
        """Shut the engine down (`generate.close_engine`)."""
        generate.close_engine(self.llm)
        self.llm = None


class _Lazy:
    """Stands for the engine in `engine_phase` before it is built: a fresh engine starts awake (nothing to wake),
    and is put to sleep through the built one."""

    def __init__(self, owner: VLLMRollouts):
        self.owner = owner

    def wake_up(self, tags=None):
        pass

    def collective_rpc(self, method: str, *args, **kwargs):  # a fresh engine has its weights: nothing to reload
        return []

    def sleep(self, level: int = 1):
        self.owner.llm.sleep(level=level)
