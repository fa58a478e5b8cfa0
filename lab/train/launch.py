"""The end of a training launch: after `accelerate launch` (or torchrun) trains on every process, the main process
evaluates alone, so vLLM finds neither the training model on the GPU, a live process group nor RANK/WORLD_SIZE."""

from __future__ import annotations

from lab.core import env

# what torchrun / accelerate set for a process of a launch; removed once the main process evaluates alone
DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
            "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def processes(launch) -> int:
    """How many processes train: `launch` is accelerate's PartialState, None for one plain process."""
    return 1 if launch is None else launch.num_processes


def main_alone(launch) -> bool:
    """After training (the caller has deleted its training model): the memory released; under a launch of several
    processes, the process group ended and the launcher's variables removed. True on the main process."""
    from lab.model.generate import release_memory

    release_memory()
    if launch is None:
        return True
    main = launch.is_main_process
    if launch.num_processes > 1:
        import torch

        launch.wait_for_everyone()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        env.unset(DIST_ENV)
    return main
