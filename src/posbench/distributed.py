"""Data-parallel training over several processes with PyTorch DDP; rank 0 alone writes.

``torchrun --nproc_per_node=N -m posbench train ...`` starts N copies of the command. Each
samples the same global batch from the same seeded generator, keeps its own disjoint slice
of it, and DDP averages the gradients, so N ranks take the step one process would take on
the whole batch. Rank 0 evaluates, keeps the checkpoint and writes every file.

On SLURM (``hydra/launcher=slurm``) every job runs one task per GPU; submitit exports the
variables torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
Backends: gloo for CPU tensors, nccl for CUDA tensors.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from .errors import PosbenchError


@dataclass(frozen=True)
class World:
    """This process's place among the ranks; one process alone is rank 0 of 1."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def batch_slice(self, batch_size: int) -> slice:
        """This rank's disjoint, equal share of a global batch of ``batch_size`` rows."""
        if batch_size % self.size:
            raise PosbenchError(f"train.batch_size={batch_size} is not divisible by the {self.size} ranks")
        per_rank = batch_size // self.size
        return slice(self.rank * per_rank, (self.rank + 1) * per_rank)

    def device(self, device: torch.device) -> torch.device:
        """Each rank on its own GPU: ``cuda`` becomes ``cuda:LOCAL_RANK``."""
        if device.type == "cuda" and device.index is None:
            return torch.device("cuda", self.local_rank)
        return device

    def mean(self, value: Tensor) -> float:
        """The mean of a scalar over the ranks (the whole batch's loss from each rank's share)."""
        if self.size == 1:
            return value.item()
        total = value.detach().float().clone()
        dist.all_reduce(total)  # SUM: gloo has no AVG
        return total.item() / self.size


def launched() -> bool:
    """True in a process that torchrun (or a multi-task SLURM job) started among several ranks."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 or _slurm_tasks() > 1


def _slurm_tasks() -> int:
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm" or "WORLD_SIZE" in os.environ:
        return 1
    return int(os.environ.get("SLURM_NTASKS", "1"))


def setup() -> World:
    """Join the process group (once per process) and return this rank's World; World() when alone."""
    if not launched():
        return World()
    if not dist.is_initialized():
        if _slurm_tasks() > 1:
            import submitit

            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
        dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    world = World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    if not world.is_main:  # one log: the other ranks keep warnings on the console, no file
        root = logging.getLogger()
        root.setLevel(logging.WARNING)
        for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
            root.removeHandler(handler)
    return world


def teardown() -> None:
    """Leave the process group while the interpreter is whole: left to finalization, gloo's threads can
    abort the process (SIGABRT) after its work is done, and torchrun would report the run as failed."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def broadcast(value, world: World):
    """Rank 0's ``value`` on every rank (any picklable object)."""
    if world.size == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class TokenNLL(nn.Module):
    """``model.token_nll`` as a forward pass: DDP synchronises gradients only through ``forward``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, idx: Tensor, targets: Tensor) -> Tensor:
        return self.model.token_nll(idx, targets)  # (B, T)


def training_loss(model: nn.Module, world: World, device: torch.device) -> nn.Module:
    """``loss(x, y) -> (B, T) NLL`` for training; under DDP when there are several ranks."""
    loss = TokenNLL(model)
    if world.size == 1:
        return loss
    # Buffers are caches computed from the config (e.g. bias tables), not state to keep in step;
    # rank 0 may grow its own while it validates.
    return DistributedDataParallel(
        loss, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False
    )


def hydra_run_args(config_name: str, args: list[str]) -> list[str]:
    """Under torchrun, every rank gets rank 0's ``hydra.run.dir``; only rank 0 writes ``.hydra/``.

    Hydra resolves ``${now:...}`` in each process, and ranks started a second apart would
    otherwise pick different folders. The folder is resolved once, on rank 0, and broadcast.
    """
    if not launched():
        return args
    if "-m" in args or "--multirun" in args:
        raise PosbenchError(
            "torchrun runs one training job; sweep with -m and hydra/launcher=slurm (one multi-GPU job per run) instead"
        )
    from hydra import compose, initialize_config_dir

    from .config import CONFIG_DIR

    world = setup()
    run_dir = None
    if world.is_main:
        overrides = [a for a in args if not a.startswith("-")]
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3", job_name=config_name):
            run_dir = str(compose(config_name, overrides=overrides, return_hydra_config=True).hydra.run.dir)
    run_dir = broadcast(run_dir, world).replace("'", "\\'")
    args = [a for a in args if not a.startswith("hydra.run.dir=")]  # resolved above
    return [*args, f"hydra.run.dir='{run_dir}'", *([] if world.is_main else ["hydra.output_subdir=null"])]
