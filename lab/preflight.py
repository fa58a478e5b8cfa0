"""Before a real-model stage spends anything: is this machine able to run it? One list of what is missing.

A stage that trains or scores the real model (02_sft, 03_grpo, 04_vote with `model.build_tiny=false`, e.g.
`model=nemotron_nano` or `experiment=competition`) runs `check(stage, overrides)` just before it opens its `Stage`
(`lab.stages.open_stage`, every notebook's first call; scripts/_launch.py), so nothing is touched and no model
loaded on a machine that cannot run it
(headless, in Jupyter and in a Kaggle kernel alike). It is called there, not from `lab.run.Stage`, because the
checks use modules that import lab.config themselves (lab.kaggle here; lab.models and lab.memory for the two to
come), and the lab's modules form no import cycle (tests/test_imports.py). Every check in `checks(stage)` runs, each a plain function of the config that raises
a `LabError` saying what is missing and how to get it; the failures are gathered into ONE LabError listing all of
them, so a user on the wrong machine learns everything at once, not one missing piece per two-minute attempt.

The checks:
- `check_gpu_extra`: the GPU packages this stage uses as configured are importable (found with
  `importlib.util.find_spec`, nothing is imported): vllm where it generates with vLLM or rolls out with it, unsloth
  where 02_sft trains with it (the same rule as the Kaggle kernel's installs, `lab.kaggle.kernel_extras`);
- `check_cuda`: torch sees a CUDA device;
- `check_model_folder`: `model.path` is a local model folder, the Kaggle mount, or a Hub id already in the local Hub
  cache (`lab.paths.check_model_path` with the cache; nothing is downloaded at run time, so a path such as
  `models/nemotron-3-nano` that does not exist is an error here, not a Hub id to fetch later);
- `lab.models.check_mamba_kernels` (02_sft, 03_grpo): the fused Mamba kernels import (training on transformers'
  PyTorch reference scan does not fit any GPU);
- `lab.grpo.check_backend` (03_grpo): the rollout back-end is one that stays exact for Nemotron-H;
- `lab.memory.check_fits` (02_sft, 03_grpo): one training micro-step traced on fake tensors fits `gpu=` (it prints
  the trace; `gpu.check=false` lets a user go on).

What it simplifies: the checks look at this machine once, when the stage opens; nothing is loaded to test them.
"""

from __future__ import annotations

import functools
import importlib.util

from omegaconf import DictConfig

from lab import LabError
from lab.config import compose, parse_overrides
from lab.paths import check_model_path

REAL_MODEL_STAGES = ("02_sft", "03_grpo", "04_vote")


def check_gpu_extra(cfg: DictConfig, stage: str) -> None:
    from lab.kaggle import kernel_extras

    missing = [x for x in kernel_extras(cfg, stage) if importlib.util.find_spec(x) is None]
    if missing:
        why = {"vllm": f"model.generation_backend={cfg.model.generation_backend}"
                       + (f", grpo.rollout_backend={cfg.grpo.rollout_backend}" if stage == "03_grpo" else ""),
               "unsloth": f"sft.backend={cfg.sft.backend}"}
        raise LabError(f"{', '.join(missing)} not installed ({'; '.join(why[x] for x in missing)}): install the GPU "
                       "extra, pip install -e '.[gpu]' (README, 'The real model')")


def check_cuda(cfg: DictConfig) -> None:
    import torch

    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a CPU-only build")
        raise LabError(f"no CUDA device ({build}): model={cfg.model.name} needs a GPU (the tiny model, model=tiny, "
                       "runs on CPU)")


def check_model_folder(cfg: DictConfig) -> None:
    check_model_path(str(cfg.model.path), hub_cache=True)  # its messages name model.path


def checks(stage: str) -> list:
    """The checks `stage` runs, each a function of the config that raises a LabError."""
    from lab import grpo, memory, models

    return [
        functools.partial(check_gpu_extra, stage=stage),
        check_cuda,
        check_model_folder,
        *([models.check_mamba_kernels] if stage in ("02_sft", "03_grpo") else []),
        *([grpo.check_backend] if stage == "03_grpo" else []),
        *([functools.partial(memory.check_fits, stage={"02_sft": "sft", "03_grpo": "grpo"}[stage])]
          if stage in ("02_sft", "03_grpo") else []),
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
