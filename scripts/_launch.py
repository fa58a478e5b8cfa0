"""What scripts/train_sft.py and train_grpo.py share under `accelerate launch` (one process per GPU).

- `open_stage`: the main process opens the stage folder and makes the split and the tiny model first
  (lab.data.dataset.prepare / lab.model.models.model_path write files), the other processes follow; without a GPU the
  processes join one gloo group (accelerate's MULTI_CPU), and a launch that asked for several processes but
  started one is refused (`check_world`);
- `done`: the exit status, and on the main process where the metrics went.

Deliberately thin: the stage itself (training, then the main process alone evaluating and finishing it) is
`lab.recipes.sft.sft` / `lab.recipes.grpo.grpo`, the notebooks' own functions, given accelerate's state.
"""

from __future__ import annotations

import os
import sys


def overrides_from(argv: list[str] | None) -> tuple[list[str], bool]:
    """Hydra overrides from the command line; `--no-eval` skips the held-out evaluation."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        print(f"usage: [accelerate launch --config_file scripts/accelerate/ddp.yaml] {sys.argv[0]} [--no-eval] "
              "[key=value ...]\n\nHydra overrides compose conf/config.yaml as in the notebooks; outputs go to "
              "<run_dir>/<stage>/ exactly as the notebook's.")
        sys.exit(0)
    no_eval = "--no-eval" in args
    return [a for a in args if a != "--no-eval"], no_eval


def check_world(env=os.environ, cuda: bool = True) -> None:
    """Refuse two launches that would silently run something else than asked.

    `accelerate launch --use_fsdp` without a GPU: accelerate 1.15 turns FSDP on only for GPU-like distributed
    types (accelerate/state.py, AcceleratorState: MULTI_CPU is not among them), so the run is plain DDP, and
    transformers loads zeros on the ranks > 0 (modeling_utils.py, `is_fsdp_enabled()`), left to DDP's broadcast.
    FSDP2 itself works on CPU/gloo (torch `fully_shard`, tests/fsdp2_probe.py); accelerate does not apply it there.

    `accelerate launch --cpu --num_processes N` (N > 1): it starts ONE process.

    accelerate 1.15 sends `--cpu` to its simple launcher (accelerate/commands/launch.py, `launch_command`),
    which starts several processes only through `mpirun` (`--mpirun_hostfile`); otherwise it starts one
    process and only sets MASTER_ADDR/MASTER_PORT (accelerate/utils/launch.py, `prepare_simple_launcher_cmd_env`).
    That process would train alone on a per-process batch, silently a different run. `torchrun` and
    `accelerate launch --multi_gpu` set WORLD_SIZE.
    """
    from lab import LabError

    if env.get("MASTER_ADDR") and "WORLD_SIZE" not in env and env.get("ACCELERATE_USE_CPU", "").lower() == "true":
        raise LabError("accelerate launch --cpu --num_processes N started one process (accelerate 1.15 starts several "
                       "CPU processes only through mpirun). Launch N CPU processes with `accelerate launch --multi_gpu "
                       "--num_processes N ...` on a machine without GPUs (or CUDA_VISIBLE_DEVICES=''), or torchrun; "
                       "see docs/scaling.md")
    if not cuda and env.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        raise LabError("accelerate launch --use_fsdp without a GPU: accelerate 1.15 applies FSDP only on GPUs and "
                       "would run plain DDP; launch without --use_fsdp on CPU (docs/scaling.md)")


def open_stage(name: str, overrides: list[str]):
    """(PartialState, Stage): the environment and the real-model preflight (lab.recipes.common.environment,
    lab.plan.preflight), then the main process first (split, tiny model), then the others."""
    from lab.recipes.common import environment

    environment()
    import torch
    from accelerate import PartialState

    from lab.core.config import compose
    from lab.data import dataset as data
    from lab.model import models
    from lab.plan import preflight
    from lab.core.run import Stage

    check_world(cuda=torch.cuda.is_available())
    cfg = compose(overrides)  # once: the preflight and the stage take it
    preflight.check(name, cfg)  # the real model: the notebooks' one list of what is missing, before anything
    if not torch.cuda.is_available():
        # accelerate names a CPU rank's device `cpu:0` (state.py, set_device); the Trainer then resumes the optimizer
        # with torch.load(map_location=cpu:0), which torch refuses ("don't know how to restore data location ...
        # cpu:0"; transformers trainer.py, _load_optimizer_and_scheduler). Plain `cpu` is the same device.
        os.environ.setdefault("ACCELERATE_TORCH_DEVICE", "cpu")
    # On a GPU this sets the process's CUDA device, so lab.model.models.load's "cuda" is the local GPU. Without one,
    # cpu=True is what makes accelerate join the launched processes in a gloo group (MULTI_CPU); the
    # default would leave each process alone (DistributedType.NO), every one training and writing by itself.
    state = PartialState(cpu=not torch.cuda.is_available())
    with state.main_process_first():
        stage = Stage(name, overrides, cfg=cfg)
        data.prepare(stage.cfg)
        models.model_path(stage.cfg)  # builds the tiny model once
    return state, stage


def done(state, stage) -> int:
    """The script's exit status; the main process says where the metrics are."""
    if state.is_main_process:
        print(f"wrote {stage.path('metrics.json')}")
    return 0
