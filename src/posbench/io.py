"""Atomic writes: a reader sees the old file or the new one, never half of one (what goes where in a run
folder is the runfolder package's)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

import pandas as pd

from .errors import root_os_error


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
    """``NAME.csv.gz`` is written gzipped (with no time stamp, so the same rows give the same bytes)."""
    gzipped = {"method": "gzip", "mtime": 0} if Path(path).name.endswith(".gz") else None
    atomic_write(path, lambda tmp: df.to_csv(tmp, index=False, compression=gzipped))


def write_text(text: str, path: Path) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
