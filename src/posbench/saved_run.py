"""A saved run, loaded to be measured again: its config (from its checkpoint) with some keys replaced, its data
and its best model.

An encoding's evaluation-time options are given under its name (``rope.scaling.*`` becomes the encoding's
``scaling``). A run still training is loaded on its best weights so far, with a warning: ``report`` leaves rows
measured on them out, and the run drops them from its own folder when it finishes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from .checkpoint import check_vocab, load_checkpoint
from .config import check_config, config_on_schema
from .data import Corpus, load_corpus
from .errors import PosbenchError
from .model import LanguageModel
from .positional import variant_namespaces
from .runfolder import CHECKPOINT, ModelState, check_mergeable, model_state, save_run_config
from .runtime import legacy_precision, resolve_device, resolve_precision, set_threads
from .tasks import build_task

log = logging.getLogger(__name__)

#: Keys of a command that loads a saved run which are not part of the run's config.
OWN_KEYS = ("checkpoint", "debug")


def run_folder(checkpoint: str) -> str:
    """The folder of a run, given its checkpoint file or the folder itself (resolver ``posbench_run_dir``)."""
    path = Path(checkpoint)
    return str(path if path.is_dir() else path.parent)


def run_config(saved: DictConfig, command: DictConfig, keys: list[str]) -> DictConfig:
    """The saved run's config on today's schema, with the command's ``keys`` replacing its values."""
    cfg = config_on_schema(saved)
    name = cfg.encoding.name
    for key in keys:
        head = key.split(".")[0]
        if head in OWN_KEYS:
            continue
        if head in variant_namespaces() and head != name:
            raise PosbenchError(f"{key} applies to runs of encoding={head}; this run is {name}")
        target = "encoding" + key.removeprefix(head) if head in variant_namespaces() else key
        OmegaConf.update(cfg, target, OmegaConf.select(command, key), merge=True)
    if "precision" not in saved and "precision" not in keys:  # a run from before the key: as it ran
        cfg.precision = legacy_precision(resolve_device(cfg.device))
    return cfg


@dataclass
class LoadedRun:
    """A saved run ready to measure: its config with the command's keys, its data and its best model."""

    cfg: DictConfig
    corpus: Corpus | None  # None for a task run
    model: LanguageModel
    device: torch.device
    state: ModelState
    trained: DictConfig  # the config the run was trained with, without the command's keys

    def taken_into(self, out_dir: Path) -> None:
        """Before rows of this run go into ``out_dir`` (whose lock the caller holds): they can, and the
        folder keeps the run's config for the report. The config as trained, not as measured: the report
        tells seeds apart by it, and the rows name their evaluation-time variant themselves."""
        check_mergeable(out_dir)
        save_run_config(out_dir, self.state.run_id, OmegaConf.to_container(self.trained, resolve=True))

    def as_trained(self) -> LanguageModel:
        """The model without the command's encoding options (a RoPE scaling changes the model itself, not
        only how it attends): what it learned is judged on this one."""
        if self.trained.encoding == self.cfg.encoding:
            return self.model
        t = self.trained
        model = LanguageModel(t.model, t.encoding, self.model.head.out_features, t.train_len, self.model.precision)
        model.load_state_dict(self.model.state_dict())
        return model.to(self.device)


def load_run(command: DictConfig, keys: list[str]) -> LoadedRun:
    """Load ``command.checkpoint`` (a checked command), its config with ``keys`` of ``command`` overridden, and its
    data."""
    path = Path(command.checkpoint)
    payload = load_checkpoint(path)
    state = model_state(payload, path / CHECKPOINT if path.is_dir() else path)
    if not state.final:
        log.warning(
            "%s is not finished (training goes on, or stopped before its end): these rows measure its best "
            "weights so far (step %d); report leaves them out, and the run drops them when it finishes",
            *(path, state.step),
        )
    cfg = run_config(payload["config"], command, keys)
    check_config(cfg)
    set_threads(cfg.threads)
    corpus = None if cfg.task else load_corpus(cfg.data)
    vocab = build_task(cfg.task).vocab if cfg.task else corpus.vocab
    check_vocab(payload, vocab, Path(command.checkpoint))
    device = resolve_device(cfg.device)
    precision, why = resolve_precision(cfg.precision, device)
    log.info("device %s, %s (%s)", device, precision, why)
    model = LanguageModel(cfg.model, cfg.encoding, len(vocab), cfg.train_len, precision).to(device)
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as e:
        raise PosbenchError(f"the checkpoint's weights do not fit its config: {str(e).splitlines()[0]}") from None
    return LoadedRun(cfg, corpus, model, device, state, config_on_schema(payload["config"]))
