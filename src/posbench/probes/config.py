"""The probes' names and options (``probes=[...]``, ``probe.*``), shared by ``train`` and ``posbench probe``."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import OmegaConf

from ..errors import ProblemsFound, raise_problems
from .context import ContextProbeConfig
from .copy import CopyProbeConfig

#: Every probe, in the order they run (see docs/probes.md).
PROBES = ("context", "window", "copy", "attention")


@dataclass
class ProbeConfig(CopyProbeConfig, ContextProbeConfig):
    """The options of every probe under ``probe.``; ``seed`` is shared by the context and copy probes."""

    def __post_init__(self):
        raise_problems(self.problems())

    def problems(self) -> list[str]:
        """Every broken rule of ``probe.*``, each probe's own and the shared seed's."""
        found = ContextProbeConfig.problems(self) + CopyProbeConfig.problems(self)
        if self.seed < 0:  # numpy's generators refuse it, after a whole training run
            found.append(f"probe.seed={self.seed} must be a non-negative integer")
        return found


def probe_config(probe) -> ProbeConfig:
    """``probe`` (a DictConfig or a dict) as a checked ProbeConfig; broken rules raise ProblemsFound (a
    ValueError) with all of them."""
    return ProbeConfig(**(OmegaConf.to_container(probe) if OmegaConf.is_config(probe) else dict(probe)))


def probes_problems(names, probe) -> list[str]:
    """Unknown probe names, and every broken ``probe.*`` rule."""
    found = []
    unknown = [name for name in names if name not in PROBES]
    if unknown:
        given = ",".join(names)
        named = ", ".join(map(repr, unknown))
        found.append(f"unknown probe {named} in probes=[{given}]; probes: {', '.join(PROBES)}")
    try:
        probe_config(probe)
    except ProblemsFound as e:
        found += e.problems
    return found
