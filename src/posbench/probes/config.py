"""The probes' names and options (``probes=[...]``, ``probe.*``), shared by ``train`` and ``posbench probe``."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import OmegaConf

from .context import ContextProbeConfig
from .copy import CopyProbeConfig

#: Every probe, in the order they run (see docs/probes.md).
PROBES = ("context", "window", "copy", "attention")


@dataclass
class ProbeConfig(CopyProbeConfig, ContextProbeConfig):
    """The options of every probe under ``probe.``; ``seed`` is shared by the context and copy probes."""

    def __post_init__(self):
        ContextProbeConfig.__post_init__(self)
        CopyProbeConfig.__post_init__(self)
        if self.seed < 0:  # numpy's generators refuse it, after a whole training run
            raise ValueError(f"probe.seed={self.seed} must be a non-negative integer")


def probe_config(probe) -> ProbeConfig:
    """``probe`` (a DictConfig or a dict) as a checked ProbeConfig; a broken rule raises ValueError."""
    return ProbeConfig(**(OmegaConf.to_container(probe) if OmegaConf.is_config(probe) else dict(probe)))


def probes_problems(names, probe) -> list[str]:
    """Unknown probe names, and the first broken ``probe.*`` rule (``ProbeConfig`` checks as it is built)."""
    found = []
    unknown = [name for name in names if name not in PROBES]
    if unknown:
        given = ",".join(names)
        found.append(f"unknown probe {unknown[0]!r} in probes=[{given}]; probes: {', '.join(PROBES)}")
    try:
        probe_config(probe)
    except ValueError as e:
        found.append(str(e))
    return found
