"""scripts/attention_by_length.py: the attention anatomy by eval_len, checked on hand-made attention_stats.csv."""

import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "attention_by_length.py"


def write_run(folder: Path, encoding: str, train_len: int, points: list[tuple], variant=None, seed=0) -> Path:
    """points: (eval_len, mean_distance) of one head each; plus rows the script must leave out."""
    base = dict(encoding=encoding, variant=variant, train_len=train_len, seed=seed, layer=0, entropy=1.0)
    rows = [dict(base, eval_len=e, head=h, mean_distance=d, status="ok") for h, (e, d) in enumerate(points)]
    probed = f"{variant}+window4" if variant else "window4"
    rows.append(dict(base, variant=probed, eval_len=8, head=0, mean_distance=99.0, status="ok"))  # eval-time variant
    rows.append(dict(base, eval_len=32, head=0, mean_distance=float("nan"), status="unsupported"))
    folder.mkdir()
    pd.DataFrame(rows).to_csv(folder / "attention_stats.csv", index=False)
    return folder


def run_script(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_cells_are_head_means_per_eval_len_in_columns_shared_by_the_runs(tmp_path):
    long = write_run(tmp_path / "long", "rope", 8, [(8, 2.0), (16, 10.0)])
    seed1 = write_run(tmp_path / "seed1", "rope", 4, [(4, 3.0)], seed=1)
    short = write_run(tmp_path / "short", "rope", 4, [(4, 1.0), (4, 2.0), (16, 12.0), (16, 13.0)])
    alibi = write_run(tmp_path / "alibi", "alibi", 4, [(4, 1500.0)], variant="randpos64")
    done = run_script(long, seed1, short, alibi)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "| encoding | variant | train_len | seed | 4 | 8 | 16 |",
        "|---|---|---:|---:|---:|---:|---:|",
        "| alibi | randpos64 | 4 | 0 | 1,500.0 |  |  |",  # thousands grouped; rows by encoding first
        "| rope |  | 4 | 0 | 1.5 |  | 12.5 |",  # (1 + 2) / 2, (12 + 13) / 2; train_len 4 before 8
        "| rope |  | 4 | 1 | 3.0 |  |  |",  # then by seed
        "| rope |  | 8 | 0 |  | 2.0 | 10.0 |",  # the window4 row (99) and the unsupported length (32) left out
    ]


def test_another_statistic_is_chosen_by_stat(tmp_path):
    run = write_run(tmp_path / "run", "rope", 4, [(4, 1.0)])
    done = run_script(run, "--stat", "entropy")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[2] == "| rope |  | 4 | 0 | 1.000 |"


def test_a_folder_without_attention_stats_is_one_error_line(tmp_path):
    done = run_script(tmp_path)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith("attention_by_length.py: error:")
    assert f"{tmp_path}: no attention_stats.csv" in done.stderr  # names what is missing, and where


def test_a_closed_pipe_ends_it_quietly(tmp_path, into_closed_pipe):
    done = into_closed_pipe([sys.executable, SCRIPT, write_run(tmp_path / "run", "rope", 4, [(4, 3.0)])])
    assert done.returncode == -signal.SIGPIPE and done.stderr == ""
