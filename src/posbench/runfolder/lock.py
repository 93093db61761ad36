"""One writer per run folder: the process writing to it holds its lock file (flock), and another that tries
gets ``RunFolderBusy``."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator

from ..errors import RunFolderBusy
from .layout import LOCK_FILE


@contextlib.contextmanager
def lock_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for this process's writes; another process trying the same gets RunFolderBusy.

    The kernel drops the lock when the process exits, killed or not. Once it is held, no other
    posbench process writes here, so temporary files left by an interrupted write are removed.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / LOCK_FILE, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise busy(run_dir, f.read().strip()) from None
        f.truncate(0)
        f.write(f"{os.getpid()}\n")
        f.flush()
        remove_orphaned_temp_files(run_dir)
        yield


def check_free(run_dir: Path) -> None:
    """RunFolderBusy if another process holds ``run_dir``, found without taking or changing anything there."""
    if not (Path(run_dir) / LOCK_FILE).is_file():
        return
    with open(Path(run_dir) / LOCK_FILE) as f:  # read only: the lock file keeps its holder's pid
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy(run_dir, f.read().strip()) from None


def busy(run_dir: Path, holder: str) -> RunFolderBusy:
    return RunFolderBusy(
        f"another posbench process (pid {holder or 'unknown'}) is writing to {run_dir}; "
        "wait for it to finish or use another folder"
    )


def remove_orphaned_temp_files(folder: Path) -> None:
    """Delete the ``.NAME.*.tmp`` files of ``atomic_write`` calls that a kill interrupted."""
    for tmp in Path(folder).glob(".*.*.tmp"):
        if tmp.is_file():
            tmp.unlink(missing_ok=True)
