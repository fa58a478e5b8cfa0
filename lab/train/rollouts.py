"""GRPO rollouts from the served adapter: `VLLMRollouts`, TRL's `rollout_func` for `grpo.rollout_backend=vllm`.

Each generation round packs the trainer's in-memory adapter exactly as the submission is packed, serves it to one vLLM
engine through a fresh `LoRARequest` and samples the round's prompts in one hand-over, so what GRPO samples is what
would be submitted and the base weights are never merged. On CUDA the engine and the trainer take turns on the card
(vLLM's sleep mode, `engine_phase`). The round step by step, TRL's hooks and vLLM's calls it relies on, and what is not
run on a GPU yet: docs/internals.md, lab.train.rollouts.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import time
from pathlib import Path

from lab import LabError
from lab.core.io import atomic_dir
from lab.core import lineage
from lab.model import generate, submission
from lab.model.submission import pack_dtype
from lab.plan.grpo_policy import separate_pass_engine
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
    """TRL `rollout_func` sampling from the served adapter (docs/internals.md, lab.train.rollouts). `model` is the PEFT
    model being trained, `workdir` the run's checkpoint folder (round folders go under `workdir/rollouts`), `budget`
    the GRPO completion budget. `engine` is built at first use unless handed in (tests)."""

    def __init__(self, cfg, model, tokenizer, workdir: str | Path, budget: int, engine=None):
        import torch

        self.cfg, self.model, self.tokenizer, self.budget = cfg, model, tokenizer, int(budget)
        self.dir = Path(workdir) / "rollouts"
        self.llm = engine
        self.cuda = torch.cuda.is_available()
        self.switch = self.cuda and bool(cfg.grpo.vllm_sleep_mode)
        self.pack_dtype = pack_dtype(cfg)
        self.level = 1
        if self.switch:  # how the engine sleeps between rounds, from the host's memory (grpo_policy.sleep_level)
            from lab.plan.grpo_policy import sleep_level

            self.level, why = sleep_level(cfg)
            print(f"rollout engine sleeps at level {self.level}: {why}", flush=True)
        self._ids = itertools.count(1)
        self.lora = None  # the LoRARequest being served
        self.rounds: list[dict] = []  # per round: step, lora_int_id, folder, seconds per part, sequences
        self.pool = None  # the last engine's real pool against its sizing (`engine_pool`), on CUDA

    # ---- the engine and the adapter --------------------------------------------------------------------------

    def _engine(self, timings: dict, phase: str = "rounds"):
        """Build the engine once (in the engine's phase: on CUDA the caller has moved the frozen weights out), sized
        for `phase` (`lab.plan.grpo_policy.generation_phase`: the rounds, or the pass rates' own engine)."""
        if self.llm is None:
            from lab.model import models

            t = time.perf_counter()
            g = self.cfg.grpo
            share = g.vllm_gpu_memory_utilization
            if share is None:  # the card less what the trainer keeps on it while the engine samples
                from lab.plan.grpo_policy import engine_share

                share = engine_share(self.cfg, phase)
            timings["engine_share"] = float(share)
            seqs = g.max_num_seqs
            if seqs is None and self.cuda:  # null: as many as the engine's share holds (lab.plan.grpo_policy)
                from lab.plan.grpo_policy import rollout_seqs

                seqs = rollout_seqs(self.cfg, phase)
            timings["max_num_seqs"] = int(seqs or self.cfg.infer.max_num_seqs)
            self.llm = generate.vllm_engine(self.cfg, models.model_path(self.cfg), max_num_seqs=seqs,
                                            gpu_memory_utilization=float(share),
                                            enable_sleep_mode=self.switch, logprobs_mode="processed_logprobs")
            timings["engine_start_s"] = time.perf_counter() - t
            self.lora = None  # a fresh engine serves no adapter yet (`_serve` removes the one it served)
            if self.cuda:
                self.pool = engine_pool(self.cfg, self.llm, timings["max_num_seqs"], phase)
        return self.llm

    def pack(self, key: str) -> Path:
        """The in-memory "default" adapter as vLLM serves it (`submission.served_adapter`), in
        `rollouts/<key>-<checksum>`: written atomically, reused when it exists (same key, same weights)."""
        sha = lineage.lora_checksum(self.model, trainable=True)[:16]
        folder = self.dir / f"{key}-{sha}"
        if (folder / "adapter" / "adapter_config.json").is_file():
            return folder / "adapter"
        self.dir.mkdir(parents=True, exist_ok=True)
        with atomic_dir(folder, "rollout adapter") as tmp:
            # only the trained adapter: TRL's "ref" copy (beta > 0) is not served
            self.model.save_pretrained(str(tmp / "peft"), selected_adapters=["default"], save_embedding_layers=False)
            submission.served_adapter(tmp / "peft", tmp, dtype=self.pack_dtype)
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
        source = {"model": base, "model_sha256": lineage.model_hash(base), "weights": "in memory, served packed",
                  "lora_sha256": lineage.lora_checksum(self.model)}
        own = self.llm is None and self.cuda and separate_pass_engine(self.cfg)
        with engine_phase(self.model, self.llm if self.llm is not None else _Lazy(self), self.switch, timings,
                          self.level):
            self._engine(timings, "pass_rates" if own else "rounds")
            if own:
                print(f"pass rates: an engine of their own ({timings['engine_share']:.2f} of the card, "
                      f"{timings['max_num_seqs']} sequences: no optimizer states before step 1), shut down after "
                      "them; the rounds' engine is built at the first round (lab.plan.grpo_policy."
                      "separate_pass_engine)", flush=True)
            self._serve(path, "start")
            yield generate.Generator.serving(self.cfg, self.llm, self.tokenizer, self.lora, source)
            if own:  # shut down, not put to sleep: the rounds' engine is another
                self.close()

    def open(self):
        """Build the engine now (else the first round or pass-rate call does), in the engine's phase; returns it."""
        timings = {}
        with engine_phase(self.model, self.llm if self.llm is not None else _Lazy(self), self.switch, timings,
                          self.level):
            self._engine(timings)
        return self.llm

    def close(self) -> None:
        """Shut the engine down (`generate.close_engine`); the next use builds a fresh one."""
        generate.close_engine(self.llm)
        self.llm = None


def engine_pool(cfg, llm, asked: int, phase: str) -> dict | None:
    """The started engine's real pool against its sizing (`lab.plan.grpo_policy.pool_capacity`), printed: vLLM's
    `llm_engine.vllm_config.cache_config` (num_gpu_blocks, block_size: set from the engine core's ready response,
    vllm/v1/engine/core_client.py `_apply_ready_response`). None, with a line, where vLLM does not say."""
    from lab.plan.grpo_policy import pool_capacity

    cache = getattr(getattr(getattr(llm, "llm_engine", None), "vllm_config", None), "cache_config", None)
    blocks = getattr(cache, "num_gpu_blocks", None)
    if not blocks:
        print("rollout engine's pool: vLLM did not report its blocks (cache_config.num_gpu_blocks)", flush=True)
        return None
    pool = pool_capacity(cfg, int(blocks), getattr(cache, "block_size", None), asked, phase)
    print(pool["text"], flush=True)
    return pool


class _Lazy:
    """Stands for the engine in `engine_phase` before it is built: a fresh engine starts awake (nothing to wake),
    and is put to sleep through the built one, if it is still up (the pass rates' own engine is shut down)."""

    def __init__(self, owner: VLLMRollouts):
        self.owner = owner

    def wake_up(self, tags=None):
        pass

    def collective_rpc(self, method: str, *args, **kwargs):  # a fresh engine has its weights: nothing to reload
        return []

    def sleep(self, level: int = 1):
        if self.owner.llm is not None:
            self.owner.llm.sleep(level=level)
