"""Before a real-model stage spends anything: can this machine run it? The lab's one list of pre-run checks.

02_sft, 03_grpo and 04_vote on the real model call `check(stage, overrides)` before they open their stage folder
(`lab.recipes.common.open_stage`, scripts/_launch.py), so nothing is touched and no model loaded on a machine that
cannot run it. `checks(stage)` lists the checks, each a function of the config that raises a LabError saying what is
missing; every check runs and the failures come as ONE LabError, so a user on the wrong machine learns everything at
once. It imports no trainer: the checks are config checks and bounds from shapes (docs/internals.md,
lab.plan.preflight).
"""

from __future__ import annotations

import functools
import importlib.util

from omegaconf import DictConfig

from lab import LabError
from lab.core.config import compose, parse_overrides
from lab.core.paths import check_model_path

REAL_MODEL_STAGES = ("02_sft", "03_grpo", "04_vote")
EXTRA_MODULES = {"vllm": "vllm", "unsloth": "unsloth", "bnb": "bitsandbytes"}  # pyproject extra -> what it installs
PIPELINE = "pipeline"  # the Kaggle kernel that runs every stage (lab.kaggle.kernel)


def kernel_extras(cfg, notebook: str) -> list[str]:
    """The lab's extras a kernel needs, from its composed config: `vllm` when the notebook generates with vLLM
    (evaluation, voting, GRPO rollouts), `unsloth` when it trains with Unsloth, `bnb` when it trains with 8-bit AdamW
    (`gpu.optim`); nothing else is installed."""
    gen = {"02_sft", "03_grpo", "04_vote", PIPELINE}
    vllm = notebook in gen and (cfg.model.generation_backend == "vllm"
                                or (notebook in ("03_grpo", PIPELINE) and cfg.grpo.rollout_backend == "vllm"))
    unsloth = notebook in ("02_sft", PIPELINE) and "unsloth" in (cfg.sft.backend, cfg.model.train_backend)
    bnb = notebook in ("02_sft", "03_grpo", PIPELINE) and cfg.gpu.optim == "adamw_bnb_8bit"
    return [x for x, need in (("vllm", vllm), ("unsloth", unsloth), ("bnb", bnb)) if need]


def check_gpu_extra(cfg: DictConfig, stage: str) -> None:
    missing = [x for x in kernel_extras(cfg, stage) if importlib.util.find_spec(EXTRA_MODULES[x]) is None]
    if missing:
        why = {"vllm": f"model.generation_backend={cfg.model.generation_backend}"
                       + (f", grpo.rollout_backend={cfg.grpo.rollout_backend}" if stage == "03_grpo" else ""),
               "unsloth": f"sft.backend={cfg.sft.backend}", "bnb": f"gpu.optim={cfg.gpu.optim}"}
        raise LabError(f"{', '.join(missing)} not installed ({'; '.join(why[x] for x in missing)}): install the GPU "
                       "extra, pip install -e '.[gpu]' (docs/real_model.md)")


def check_cuda(cfg: DictConfig) -> None:
    import torch

    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a CPU-only build")
        raise LabError(f"no CUDA device ({build}): model={cfg.model.name} needs a GPU (the tiny model, model=tiny, "
                       "runs on CPU)")


def check_packing(cfg: DictConfig) -> None:
    """`sft.packing=true`: the Mamba kernels transformers resolved take `seq_idx`
    (`lab.model.packed_rows.require_kernels`). Silent when the kernels do not import or there is no GPU:
    `check_mamba_kernels` and `check_cuda` say so."""
    import torch

    from lab.model import models, packed_rows

    if cfg.sft.packing and torch.cuda.is_available() and not models.missing_mamba_kernels():
        packed_rows.require_kernels()


def check_backend(cfg: DictConfig) -> str:
    """`grpo.rollout_backend`, checked: `hf` or `vllm` (the vllm route: lab.train.rollouts, never TRL's own
    `use_vllm`, which syncs merged bf16 weights and drifts the frozen base: docs/grpo.md). `refine` with vllm is
    refused (its drafts use TRL's own generation, which would be transformers')."""
    backend = cfg.grpo.rollout_backend  # hf or vllm: lab/core/schema.py's GenerationBackend refuses others at compose
    if backend == "vllm" and cfg.grpo.refine:
        raise LabError("conf/grpo: refine=true with rollout_backend=vllm is not built: refinement draws its drafts "
                       "with TRL's own generation (lab.train.grpo_refine), which is transformers' here. Set "
                       "grpo.rollout_backend=hf with refine, or grpo.refine=false")
    return backend


def checks(stage: str) -> list:
    """The checks `stage` runs, each a function of the config that raises a LabError."""
    from lab.model import models
    from lab.plan import grpo_policy, memory

    trains = {"02_sft": "sft", "03_grpo": "grpo"}.get(stage)  # what lab.plan.memory calls the stage, if it trains
    return [
        functools.partial(check_gpu_extra, stage=stage),
        check_cuda,
        lambda cfg: check_model_path(str(cfg.model.path)),  # its messages name model.path
        *([models.check_mamba_kernels] if trains else []),
        *([check_packing] if stage == "02_sft" else []),
        *([check_backend] if stage == "03_grpo" else []),
        *([functools.partial(memory.check_fits, stage=trains)] if trains else []),
        *([grpo_policy.check_generation_fits] if stage == "03_grpo" else []),
    ]


def applies(stage: str, cfg: DictConfig) -> bool:
    """Whether `stage` trains or scores the real model (the tiny model is built here and runs anywhere)."""
    return stage in REAL_MODEL_STAGES and not cfg.model.build_tiny


def problems(stage: str, cfg: DictConfig) -> list[str]:
    """The message of every check of `checks(stage)` that fails (empty when none does)."""
    out = []
    for check in checks(stage):
        try:
            check(cfg)
        except LabError as e:
            out.append(str(e))
    return out


def check(stage: str, overrides) -> None:
    """Nothing for a stage that does not use the real model; else a LabError listing everything missing.
    `overrides`: the notebook's `overrides` parameter (composed here, as `Stage` will) or a composed config."""
    cfg = overrides if isinstance(overrides, DictConfig) else compose(parse_overrides(overrides))
    if not applies(stage, cfg):
        return
    found = problems(stage, cfg)
    if found:
        raise LabError(f"{stage} with model={cfg.model.name} cannot run on this machine; missing:\n"
                       + "\n".join(f"  - {p}" for p in found) + "\n(nothing was run or changed)")
