"""``posbench eval``: evaluate a saved run again, at other lengths, in another mode or in another variant.

The run's own config (from its checkpoint) is the starting point; only the keys given on
the command line replace it. An encoding's evaluation-time options are set under its name
(``rope.scaling.*`` becomes the encoding's ``scaling``). Rows go to the run's results.csv, per_position.csv
and per_article.csv (a task run's to task_results.csv), merged by the identity of a row
(``runfolder.merge_rows``: the run, the state of its weights, and split, eval_len, eval_mode, stride,
variant and precision); ``hydra.run.dir=DIR`` writes to DIR instead, beside the rows of other runs there.
A run still training is evaluated on its best weights so far, with a warning: ``report`` leaves such rows
out, and the run drops them from its own folder when it finishes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import List, Optional

import pandas as pd
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from .checkpoint import check_vocab, load_checkpoint
from .config import EvalConfig, check_config, config_on_schema, eval_problems
from .data import Corpus, DataConfig, load_corpus
from .errors import PosbenchError, raise_problems
from .evaluate import evaluate_lengths
from .model import LanguageModel
from .positional import variant_namespaces
from .runfolder import (
    CHECKPOINT,
    RESULTS,
    TASK_RESULTS,
    ModelState,
    check_mergeable,
    lock_run_dir,
    merge_rows,
    model_state,
    save_run_config,
)
from .runtime import legacy_precision, resolve_device, resolve_precision, set_threads
from .tasks import build_task
from .tasks.measure import measured

log = logging.getLogger(__name__)

#: Keys of the eval command that are not part of the run's config.
OWN_KEYS = ("checkpoint", "debug")


@dataclass
class EvalModelConfig:
    #: Log-n attention scaling (``model.logn_scaling``): it changes no weight, so a run trained
    #: without it can be evaluated with it (rows get ``variant=logn``).
    logn_scaling: bool = False


@dataclass
class EvalCommandConfig:
    #: A checkpoint.pt, or the run folder holding one.
    checkpoint: str = MISSING
    #: ``null``: the run's own lengths.
    eval_lens: Optional[List[int]] = None
    eval: EvalConfig = field(default_factory=EvalConfig)
    model: EvalModelConfig = field(default_factory=EvalModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    device: str = "auto"
    #: ``auto``, ``fp32`` or ``bf16`` (see ``Config.precision``); like every key, used only when given.
    precision: str = "auto"
    #: Torch CPU threads (``null``: torch's default); set 1 when N evaluations share N cores.
    threads: Optional[int] = None
    debug: bool = False


def run_folder(checkpoint: str) -> str:
    """The folder of a run, given its checkpoint file or the folder itself (resolver ``posbench_run_dir``)."""
    path = Path(checkpoint)
    return str(path if path.is_dir() else path.parent)


def eval_schema(base: type = EvalCommandConfig) -> type:
    """``base`` plus one namespace per encoding with evaluation-time options (``rope.scaling``)."""
    namespaces = [(name, options, field(default_factory=options)) for name, options in variant_namespaces().items()]
    return make_dataclass(f"{base.__name__}Schema", namespaces, bases=(base,))


def register(schema: str = "eval_schema", base: type = EvalCommandConfig) -> None:
    """Store the schema of a command that loads a saved run (``eval``, ``probe``) as ``schema``."""
    ConfigStore.instance().store(name=schema, node=eval_schema(base))
    OmegaConf.register_new_resolver("posbench_run_dir", run_folder, replace=True)


def command_problems(cfg) -> list[str]:
    """What can be checked before loading anything: the checkpoint and ``eval.*``."""
    found = eval_problems(cfg.eval)
    if OmegaConf.is_missing(cfg, "checkpoint"):
        return ["eval needs checkpoint=PATH (a checkpoint.pt or the run folder holding one)", *found]
    path = Path(cfg.checkpoint)
    if path.is_dir() and not (path / CHECKPOINT).is_file():
        found.insert(0, f"checkpoint={path}: the folder holds no {CHECKPOINT} (a run saves it at its first validation)")
    elif not path.is_dir() and not path.is_file():
        found.insert(0, f"checkpoint {path} does not exist")
    return found


def check_command(cfg) -> None:
    """``posbench eval``'s check: every problem of ``command_problems`` at once."""
    raise_problems(command_problems(cfg))


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
    """A saved run ready to evaluate: its config with the command's keys, its data and its best model."""

    cfg: DictConfig
    corpus: Corpus | None  # None for a task run
    model: LanguageModel
    device: torch.device
    state: ModelState

    def taken_into(self, out_dir: Path) -> None:
        """Before rows of this run go into ``out_dir`` (whose lock the caller holds): they can, and the
        folder keeps the run's config for the report."""
        check_mergeable(out_dir)
        save_run_config(out_dir, self.state.run_id, OmegaConf.to_container(self.cfg, resolve=True))


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
    return LoadedRun(cfg, corpus, model, device, state)


def evaluate_checkpoint(command: DictConfig, keys: list[str], out_dir: Path, checked: bool = False) -> pd.DataFrame:
    """Evaluate ``command.checkpoint`` with ``keys`` of ``command`` overridden; merge rows into ``out_dir``.

    ``checked``: ``check_command`` has run on ``command`` (``posbench eval`` runs it on every job before the first
    starts); a direct call leaves it False, and the command is checked here."""
    if not checked:
        check_command(command)
    run = load_run(command, keys)
    out_dir = Path(out_dir)
    with lock_run_dir(out_dir):
        run.taken_into(out_dir)
        if run.cfg.task:
            name, results = TASK_RESULTS, measured(run.model, build_task(run.cfg.task), run.cfg, run.device)
        else:
            name, results = RESULTS, evaluate_lengths(run.model, run.corpus, run.cfg, run.device, out_dir, run.state)
        merge_rows(out_dir, name, results, run.state)
    log.info("%d rows written to %s", len(results), out_dir / name)
    return results


def command_line_keys() -> list[str]:
    """The keys set on the command line: those of Hydra's task overrides."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return [o.key_or_group for o in OverridesParser.create().parse_overrides(list(HydraConfig.get().overrides.task))]


def eval_command(cfg: DictConfig, out_dir: str) -> pd.DataFrame:
    """The Hydra task of ``posbench eval``."""
    return evaluate_checkpoint(cfg, command_line_keys(), Path(out_dir), checked=True)
