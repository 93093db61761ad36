"""Atomic writes: a reader sees the old file or the new one, never half of one, and no debris is left."""

from __future__ import annotations

import os
import stat

import pandas as pd
import pytest

from posbench import io
from posbench.io import atomic_write, write_csv, write_text


def debris(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "sub" / "results.csv"  # missing folders are made
    write_csv(pd.DataFrame({"eval_len": [32, 64], "ppl": [10.5, 12.25]}), path)
    assert path.read_text() == "eval_len,ppl\n32,10.5\n64,12.25\n"
    write_text("replaced\n", path)
    assert path.read_text() == "replaced\n"
    assert debris(path.parent) == []


def test_a_write_that_fails_half_way_leaves_the_old_file_and_no_debris(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text("old, complete\n")

    def half_then_crash(tmp):
        tmp.write_text("new, trunc")
        raise KeyboardInterrupt  # as if interrupted in the middle of writing

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, half_then_crash)
    assert path.read_text() == "old, complete\n"
    assert debris(tmp_path) == []


def test_data_reaches_the_disk_before_the_rename(tmp_path, monkeypatch):
    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(io.os, "fsync", lambda fd: (events.append("fsync"), fsync(fd))[1])
    monkeypatch.setattr(io.os, "replace", lambda a, b: (events.append("rename"), replace(a, b))[1])
    write_text("x\n", tmp_path / "f.txt")
    assert events == ["fsync", "rename"]


def test_files_get_ordinary_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        write_text("x\n", tmp_path / "f.txt")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "f.txt").stat().st_mode) == 0o644  # not mkstemp's 0600
