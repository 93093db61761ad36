"""Synthetic retrieval tasks (``task=passkey|mqar|copy``; docs/tasks.md): models that must read.

A task generates its sequences on the fly from a seeded generator, over a small vocabulary of its own, with
the answer a controlled distance from what it retrieves (:mod:`.base`). ``train`` trains on them (the loss
on the answer, or on every token) and ``measure`` writes task_results.csv (:mod:`.measure`).

To add a task: a module here with a ``TaskConfig`` subclass (setting ``name``) and a ``Task`` subclass
naming it as ``config_class``, an entry in ``TASKS`` and ``conf/task/<name>.yaml``.
"""

from __future__ import annotations

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from .base import LOSSES, Task, TaskConfig
from .copy import Copy
from .mqar import Mqar
from .passkey import Passkey

TASKS: dict[str, type[Task]] = {"copy": Copy, "mqar": Mqar, "passkey": Passkey}


def build_task(cfg) -> Task:
    """The task named by ``cfg.name``, from its options (a dataclass, dict or DictConfig); a key it does not
    have, a value of the wrong type or a broken rule raises ValueError naming the key."""
    name = cfg["name"] if isinstance(cfg, dict) else cfg.name
    if name not in TASKS:
        raise ValueError(f"task.name must be one of {', '.join(TASKS)}, got {name!r}")
    try:
        config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TASKS[name].config_class), cfg))
    except ConfigKeyError as e:
        raise ValueError(f"task.{e.full_key} is not an option of task={name}") from None
    except OmegaConfBaseException as e:
        raise ValueError(f"task.{e.full_key}: {str(e).splitlines()[0]}") from None
    for key in ("filler_symbols", "symbols", "trials"):
        if getattr(config, key) < 1:
            raise ValueError(f"task.{key} must be a positive integer, got {getattr(config, key)}")
    if config.loss not in LOSSES:
        raise ValueError(f"task.loss must be one of {', '.join(LOSSES)}, got {config.loss!r}")
    if config.distances is not None and (not config.distances or min(config.distances) < 0):
        raise ValueError(f"task.distances={list(config.distances)} must be non-negative integers")
    task = TASKS[name](config)
    task.check()
    return task


__all__ = ["TASKS", "Task", "TaskConfig", "build_task"]
