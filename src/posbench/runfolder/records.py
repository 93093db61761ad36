"""What a run folder says about its runs besides their rows: the config of each (the report tells runs apart
by it), the one-line account of why training stopped, and whether training has not ended yet."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import yaml

from ..errors import Refused, describe
from ..io import write_text
from .layout import ERROR_FILE, HYDRA_DIR, RESUME_CHECKPOINT, RUN_CONFIGS, legacy_run_id


def save_run_config(folder: Path, run_id: str, config: dict) -> None:
    """Keep the config of a run whose rows go into ``folder``: the report tells runs apart by it."""
    write_text(yaml.safe_dump(config, sort_keys=True), Path(folder) / RUN_CONFIGS / f"{run_id}.yaml")


def run_configs(folder: Path) -> dict[str, dict]:
    """The configs of the runs with rows in ``folder``, by run id. A training folder from before run ids
    has its run's config in Hydra's record only (the run of ``legacy_run_id``)."""
    configs = {}
    hydra = Path(folder) / HYDRA_DIR
    with contextlib.suppress(OSError, yaml.YAMLError, TypeError, KeyError):
        if yaml.safe_load((hydra / "hydra.yaml").read_text())["hydra"]["job"]["name"] == "train":
            configs[legacy_run_id(folder)] = yaml.safe_load((hydra / "config.yaml").read_text())
    for path in sorted((Path(folder) / RUN_CONFIGS).glob("*.yaml")):
        with contextlib.suppress(OSError, yaml.YAMLError):
            configs[path.stem] = yaml.safe_load(path.read_text())
    return configs


def record_error(message: str, folder: Path) -> None:
    """The run's one-line account for ``report``; a folder that cannot take it (read-only, full) does without."""
    with contextlib.suppress(OSError):
        write_text(f"{message}\n", Path(folder) / ERROR_FILE)


@contextlib.contextmanager
def errors_recorded(folder: Path | None) -> Iterator[None]:
    """Training's account of why it stopped: any failure or signal goes to ``folder``'s error.txt, except a
    refusal, which leaves the folder as it was (None: this process does not write the folder)."""
    try:
        yield
    except (Exception, KeyboardInterrupt) as e:
        if folder is not None and not isinstance(e, Refused):
            record_error(describe(e), folder)
        raise


def clear_error(folder: Path) -> None:
    """A run that starts again starts with a clean slate."""
    with contextlib.suppress(OSError):
        (Path(folder) / ERROR_FILE).unlink(missing_ok=True)


def unfinished_reason(folder: Path) -> str:
    """Why a folder's run is not finished ("" when it is, or holds no training of its own)."""
    if (Path(folder) / RESUME_CHECKPOINT).is_file():
        return f"unfinished: training has not ended ({RESUME_CHECKPOINT} present; train.resume=auto continues it)"
    return ""
