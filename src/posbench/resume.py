"""Resuming: whether a run folder holds a finished run, where to continue from, and what last.pt holds.

Every ``train.checkpoint_every`` steps, at the last step and on SIGINT/SIGTERM the whole training
state goes to ``last.pt`` (model, optimizer, scheduler, step, tokens seen, every RNG state including
the data sampler's, the best model and loss so far, the validations since the best that
``train.patience`` counts and whether it ran out, the log). ``train.resume=auto`` continues from it,
and the resumed run ends with exactly the numbers of an uninterrupted one, stopping where it would
have. ``last.pt`` is deleted only after results.csv is written, so a folder holding it is never a
finished run. ``train.resume=false`` first clears the folder's results and checkpoints.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from .checkpoint import load_checkpoint
from .config import config_on_schema
from .errors import PosbenchError, Refused
from .lengths import eval_lens_of
from .runfolder import CHECKPOINT, ERROR_FILE, RESULTS, RESUME_CHECKPOINT, TASK_RESULTS, model_state, read_csv
from .runtime import legacy_precision, resolve_device, resolve_precision, rng_states, set_rng_states

#: Keys that may differ between a run and its resumption: they do not change a single number.
RESUME_IGNORED = ("train.resume", "train.checkpoint_every", "debug", "device", "data.path", "threads", "logger")
#: What a run writes to its folder besides .hydra/ and its log; ``train.resume=false`` removes these first.
RUN_OUTPUTS = ("*.csv", CHECKPOINT, RESUME_CHECKPOINT, ERROR_FILE, "events.out.tfevents.*")


def flatten(tree, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}"""
    if not (isinstance(tree, dict) and tree):
        return {prefix: tree}
    flat = {}
    for key, value in tree.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def config_differences(saved, current, saved_precision: str | None = None) -> list[str]:
    """``key: saved -> current`` for every setting that changes the numbers (RESUME_IGNORED left out).

    The saved config is read on today's schema (``config_on_schema``): a key added since it was saved
    reads as its default, which leaves a run as it was. ``precision`` is compared as resolved: the
    current one on this run's device, the saved one as ``saved_precision`` says the run computed (a
    checkpoint's ``precision``: ``auto`` picks bf16 on one CPU and fp32 on another), else as resolved
    here; a run saved before the key existed ran in ``legacy_precision``.
    """
    saved = OmegaConf.create(saved)
    a = flatten(OmegaConf.to_container(config_on_schema(saved), resolve=True))
    b = flatten(OmegaConf.to_container(current, resolve=True))
    if "precision" in b:
        device = resolve_device(b["device"])
        a["precision"] = saved_precision or (
            resolve_precision(saved.precision, device)[0] if "precision" in saved else legacy_precision(device)
        )
        b["precision"] = resolve_precision(b["precision"], device)[0]
    keys = [k for k in sorted(a.keys() | b.keys()) if not any(k == i or k.startswith(f"{i}.") for i in RESUME_IGNORED)]
    absent = "(absent)"
    return [f"{k}: {a.get(k, absent)} -> {b.get(k, absent)}" for k in keys if a.get(k, absent) != b.get(k, absent)]


def mismatch(what: str, differences: list[str]) -> Refused:
    shown = "; ".join(differences[:3]) + (f"; and {len(differences) - 3} more" if len(differences) > 3 else "")
    return Refused(
        f"{what} has another config ({shown}); pass train.resume=false to start afresh, or use another run folder"
    )


def check_same_config(checkpoint: dict, current, what: str) -> None:
    """Refuse to continue or skip a run saved with another config; ``what`` names the saved run."""
    try:
        differences = config_differences(checkpoint["config"], current, checkpoint.get("precision"))
    except PosbenchError as e:  # saved by a version of posbench whose config this one cannot read
        differences = [str(e)]
    if differences:
        raise mismatch(what, differences)


def finished_run(cfg: DictConfig, run_dir: Path) -> dict | None:
    """The metrics of a run already finished in ``run_dir`` with this config (results.csv complete, or a task
    run's task_results.csv), else None."""
    results_path, best_path = run_dir / (RESULTS if cfg.task is None else TASK_RESULTS), run_dir / CHECKPOINT
    if str(cfg.train.resume).lower() not in ("auto", "true") or not (results_path.is_file() and best_path.is_file()):
        return None
    if (run_dir / RESUME_CHECKPOINT).is_file():
        return None  # interrupted: a results.csv here was written by `eval`, not by the end of training
    best = load_checkpoint(best_path)
    check_same_config(best, cfg, f"{run_dir} holds a finished run that")
    try:
        results = read_csv(results_path)
        results = results[results["run_id"] == model_state(best, best_path).run_id]  # the folder may hold others'
        measured = set(results["eval_len"]) if cfg.task else set(zip(results["split"], results["eval_len"]))
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, KeyError):
        return None  # not a complete results.csv: train (or resume) and write it again
    wanted = {(split, eval_len) for split in cfg.eval.splits for eval_len in eval_lens_of(cfg)}
    if not (set(eval_lens_of(cfg)) if cfg.task else wanted) <= measured:
        return None
    return {"best_valid_loss": best["valid_loss"], "results": results}


def start_afresh(run_dir: Path) -> None:
    """Remove the results and checkpoints of an earlier run in ``run_dir`` (RUN_OUTPUTS; not .hydra/ or logs)."""
    for pattern in RUN_OUTPUTS:
        for path in Path(run_dir).glob(pattern):
            if path.is_file():
                path.unlink()


def resume_source(cfg: DictConfig, run_dir: Path) -> Path | None:
    """The last.pt that ``train.resume`` asks to continue from, or None to start afresh."""
    choice = str(cfg.train.resume)
    if choice.lower() == "false":
        return None
    if choice.lower() in ("auto", "true"):
        path = run_dir / RESUME_CHECKPOINT
        if choice.lower() == "true" and not path.is_file():
            raise Refused(f"train.resume=true but {run_dir} holds no {RESUME_CHECKPOINT} to resume from")
        return path if path.is_file() else None
    path = Path(choice).expanduser()
    return path / RESUME_CHECKPOINT if path.is_dir() else path


def resume_state(model, optimizer, scheduler, gen, progress: dict, cfg, vocab) -> dict:
    """Everything last.pt holds: with it, training continues as if it had never stopped."""
    return {
        "model": model.state_dict(),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "precision": model.precision,  # what ``auto`` resolved to on the machine that trained
        "vocab": vocab,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": {**rng_states(), "data": gen.get_state()},
        "progress": progress,
    }


def restore(path: Path, model, optimizer, scheduler, gen, cfg, vocab) -> dict:
    """Put the training state of ``path`` (a last.pt) back in place; returns the loop's saved progress."""
    state = load_checkpoint(path, encoding=cfg.encoding.name, vocab=vocab)
    missing = sorted({"optimizer", "scheduler", "rng", "progress"} - state.keys())
    if missing:
        raise PosbenchError(
            f"checkpoint {path} holds no training state (no {', '.join(missing)}); resume needs a {RESUME_CHECKPOINT}"
        )
    check_same_config(state, cfg, f"checkpoint {path}")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    gen.set_state(state["rng"]["data"])
    set_rng_states(state["rng"])
    return state["progress"]
