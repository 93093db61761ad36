"""Run-folder files: atomic writes (a reader sees the old file or the new one, never half of one) and
the lock that keeps a second process from writing to a folder in use."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import pandas as pd

from .errors import RunFolderBusy, root_os_error

#: A run folder's one-line account of why its run stopped (written by the CLI, read by ``report``).
ERROR_FILE = "error.txt"
#: Held (flock) by the process writing to a run folder; it holds that process's pid.
LOCK_FILE = ".lock"


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, fsync it, then rename it over ``path``.

    On failure the temporary file is removed, and an OSError (read-only folder, full disk) names ``path``.
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file ordinary permissions
        write(Path(tmp))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as e:  # torch reports a failed write as a RuntimeError around the OSError
        cause = root_os_error(e)
        if cause is None:
            raise
        raise OSError(cause.errno, cause.strerror, str(path)) from e
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def write_csv(df: pd.DataFrame, path: Path) -> None:
    atomic_write(path, lambda tmp: df.to_csv(tmp, index=False))


def write_text(text: str, path: Path) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


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
            holder = f.read().strip() or "unknown"
            raise RunFolderBusy(
                f"another posbench process (pid {holder}) is writing to {run_dir}; "
                "wait for it to finish or use another folder"
            ) from None
        f.truncate(0)
        f.write(f"{os.getpid()}\n")
        f.flush()
        remove_orphaned_temp_files(run_dir)
        yield


def remove_orphaned_temp_files(folder: Path) -> None:
    """Delete the ``.NAME.*.tmp`` files of ``atomic_write`` calls that a kill interrupted."""
    for tmp in Path(folder).glob(".*.*.tmp"):
        tmp.unlink(missing_ok=True)
