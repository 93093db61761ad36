"""scripts/loss_by_position.py: the excess loss by window position, checked on hand-made per_position.csv."""

import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "loss_by_position.py"


def write_run(folder: Path, train_len: int, points: list[tuple], seed: int = 0) -> Path:
    """points: (eval_len, position, nll, count); plus rows the script must leave out."""
    base = dict(encoding="rope", train_len=train_len, seed=seed, split="test", eval_mode="nonoverlapping")
    rows = [dict(base, variant=None, eval_len=e, position=p, nll=n, count=c) for e, p, n, c in points]
    rows.append(dict(base, variant="window4", eval_len=8, position=6, nll=99.0, count=1))  # a variant
    rows.append(dict(base, variant=None, split="valid", eval_len=8, position=6, nll=99.0, count=1))
    rows.append(dict(base, variant=None, eval_mode="sliding", eval_len=8, position=6, nll=99.0, count=1))
    folder.mkdir()
    pd.DataFrame(rows).to_csv(folder / "per_position.csv", index=False)
    return folder


def test_cells_are_token_weighted_excess_over_the_training_length(tmp_path):
    short = write_run(tmp_path / "short", 4, [(4, 0, 5.0, 3), (4, 3, 6.0, 1),  # base (3·5 + 6) / 4 = 5.25
                                              (8, 1, 5.5, 1), (8, 4, 6.0, 1), (8, 7, 7.0, 3)])  # fmt: skip
    long = write_run(tmp_path / "long", 8, [(8, 0, 5.0, 2), (8, 4, 5.5, 2)])  # base 5.25, no 4-token windows
    seed1 = write_run(tmp_path / "seed1", 4, [(4, 0, 5.0, 1), (8, 1, 5.0, 1)], seed=1)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(long), str(seed1), str(short), "--eval-len", "8", "--edges", "0,4,8"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert lines[0] == "| encoding | train_len | seed | NLL at train_len | 0–3 | 4–7 |"
    assert lines[2] == "| rope | 4 | 0 | 5.250 | +0.250 | +1.500 |"  # 5.5 − 5.25; (6 + 3·7) / 4 − 5.25
    assert lines[3] == "| rope | 4 | 1 | 5.000 | +0.000 |  |"  # then by seed; 4–7 holds only rows left out
    assert lines[4] == "| rope | 8 | 0 | 5.250 | −0.250 | +0.250 |"  # rows by train_len, not in the order given


def test_default_bins_double_from_64_and_end_at_eval_len(tmp_path):
    short = write_run(tmp_path / "short", 4, [(4, 0, 5.0, 1)])
    args = [sys.executable, str(SCRIPT), str(short), "--eval-len", "200"]
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[0] == "| encoding | train_len | seed | NLL at train_len | 0–63 | 64–127 | 128–199 |"


def test_a_folder_without_per_position_csv_is_one_error_line(tmp_path):
    args = [sys.executable, str(SCRIPT), str(tmp_path), "--eval-len", "8"]
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith("loss_by_position.py: error:")
    assert f"{tmp_path}: no per_position.csv" in done.stderr  # names what is missing, and where


def test_a_variant_is_read_against_the_run_as_trained(tmp_path):
    short = write_run(tmp_path / "short", 4, [(4, 0, 5.0, 1)])  # as trained at train_len: 5.0
    args = [
        sys.executable,
        str(SCRIPT),
        str(short),
        "--eval-len",
        "8",
        "--edges",
        "0,4,8",
        "--variant",
        "window{train_len}",
    ]
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[2] == "| rope | 4 | 0 | 5.000 |  | +94.000 |"  # window4's one row: 99 − 5


def test_a_closed_pipe_ends_it_quietly(tmp_path, into_closed_pipe):
    short = write_run(tmp_path / "short", 4, [(4, 0, 5.0, 1)])
    done = into_closed_pipe([sys.executable, SCRIPT, short, "--eval-len", "8"])
    assert done.returncode == -signal.SIGPIPE and done.stderr == ""
