"""Atomic writes (the old file or the new one, never half, no debris, failures name the file); the run-folder lock."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys

import pandas as pd
import pytest

from posbench import io
from posbench.errors import PosbenchError, RunFolderBusy
from posbench.io import atomic_write, write_csv, write_text
from posbench.runfolder import LOCK_FILE, lock_run_dir


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


def test_a_failed_write_is_an_oserror_naming_the_destination_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "last.pt"

    def disk_full(tmp):
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")  # as a full disk reports it: no file name

    with pytest.raises(OSError) as caught:
        atomic_write(path, disk_full)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
    assert debris(tmp_path) == [] and not path.exists()


@pytest.mark.parametrize("step", ["mkstemp", "chmod"])
def test_a_read_only_folder_is_an_oserror_naming_the_destination(tmp_path, monkeypatch, step):
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / ".results.csv.x.tmp"))

    monkeypatch.setattr(io.tempfile if step == "mkstemp" else io.os, step, refuse)
    with pytest.raises(PermissionError) as caught:
        write_text("x\n", tmp_path / "results.csv")
    assert caught.value.filename == str(tmp_path / "results.csv")
    assert debris(tmp_path) == []


def test_a_really_read_only_folder_names_the_destination(tmp_path, read_only):
    folder = read_only(tmp_path / "run")
    with pytest.raises(PermissionError) as caught:
        write_text("x\n", folder / "results.csv")
    assert caught.value.filename == str(folder / "results.csv")


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    with lock_run_dir(tmp_path):
        with pytest.raises(RunFolderBusy) as caught:
            with lock_run_dir(tmp_path):
                pytest.fail("two writers in one folder")
        assert str(caught.value) == (
            f"another posbench process (pid {os.getpid()}) is writing to {tmp_path}; "
            "wait for it to finish or use another folder"
        )
    with lock_run_dir(tmp_path):  # released on leaving
        pass


def test_the_lock_goes_with_a_killed_process(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(PosbenchError, match=f"another posbench process \\(pid {holder.pid}\\)"):
            with lock_run_dir(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()
    with lock_run_dir(tmp_path):
        assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"


HOLD_LOCK = """
import sys, time
from posbench.runfolder import lock_run_dir
with lock_run_dir(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_taking_the_lock_removes_temp_files_of_interrupted_writes(tmp_path):
    orphans = [".last.pt.k2j4x9_a.tmp", ".results.csv.abc123.tmp"]
    kept = ["last.pt", "notes.tmp", ".lock"]
    for name in orphans + kept:
        (tmp_path / name).write_text("x")
    with lock_run_dir(tmp_path):
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
