"""scripts/results_table.py: the docs' tables from a report folder's CSVs, checked on a hand-made report."""

import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "results_table.py"


def point(encoding, variant, eval_len, mean, std=None, seeds=2, status=None):
    return dict(encoding=encoding, variant=variant, train_len=256, train_lengths="256", eval_mode="nonoverlapping",
                split="test", eval_len=eval_len, seeds=seeds, ppl_mean=mean, ppl_std=std, status=status)  # fmt: skip


def write_report(folder: Path) -> Path:
    summary = [
        point("alibi", None, 256, 205.0, 7.07),  # seeds 200 and 210
        point("alibi", None, 512, 195.0, 7.07),  # seeds 190 and 200: −4.878%
        point("alibi", "window256", 256, 205.0, 7.07),
        point("alibi", "window256", 512, 184.5, 1.0),  # −10.0%
        point("learned", None, 256, 240.0, seeds=1),
        point("learned", None, 512, None, seeds=1, status="unsupported"),
    ]
    pd.DataFrame(summary).to_csv(folder / "summary.csv", index=False)
    runs = [("alibi", 1, 1400, 900), ("alibi", 0, 2400, 2000), ("learned", 0, 2400, 2400)]
    results = [dict(encoding=e, variant=None, train_len=256, train_lengths="256", eval_mode="nonoverlapping",
                    split="test", eval_len=n, seed=seed, stopped_step=stop, best_step=best, run_dir=f"{e}{seed}")
               for e, seed, stop, best in runs for n in (256, 512)]  # fmt: skip
    pd.DataFrame(results).to_csv(folder / "results.csv", index=False)
    probes = [dict(encoding="alibi", variant=None, train_len=256, train_lengths="256", seed=s, gain_beyond=g,
                   effective_context=c, window_gap=-0.01, mass_beyond=0.125)
              for s, g, c in [(0, -0.002, 32), (1, -0.004, 128)]]  # fmt: skip
    pd.DataFrame(probes).to_csv(folder / "probes.csv", index=False)
    return folder


def rows(*args: str) -> list[list[str]]:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=True)
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in done.stdout.splitlines()]


def test_a_row_per_model_with_seeds_steps_changes_and_probes(tmp_path):
    heading, _, alibi, learned = rows(str(write_report(tmp_path)), "--window", "512")
    assert heading[:7] == ["encoding", "variant", "train_len", "stopped / best step", "at train_len", "512",
                           "window of train_len keys, at 512"]  # fmt: skip
    assert alibi[:7] == ["alibi", "", "256", "2,400 / 2,000; 1,400 / 900", "205.0 ± 7.1", "195.0 ± 7.1 (−4.9%)",
                         "184.5 ± 1.0 (−10.0%)"]  # fmt: skip
    assert alibi[7:] == ["−0.003", "32, 128", "−0.010", "0.12"]
    assert learned[:7] == ["learned", "", "256", "2,400 / 2,400", "240.0", "unsupported", ""]
    assert learned[7:] == ["", "", "", ""]


def test_multiples_name_the_columns_by_their_ratio_to_train_len(tmp_path):
    heading, _, alibi, _ = rows(str(write_report(tmp_path)), "--multiples", "--encodings", "alibi,learned")
    assert heading[4:6] == ["1×", "2×"] and alibi[5] == "195.0 ± 7.1 (−4.9%)"
    assert [r[0] for r in rows(str(tmp_path), "--encodings", "learned")[2:]] == ["learned"]


def test_a_folder_that_is_no_report_is_one_error_line(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith("results_table.py: error:") and "summary.csv" in done.stderr


def test_variants_print_a_row_per_evaluation_with_its_mode_and_tokens(tmp_path):
    def evaluation(variant, mode, tokens, ppl_256, ppl_512):
        keys = dict(encoding="rope", variant=variant, train_len=256, train_lengths="256", eval_mode=mode, split="test")
        summary = [
            dict(keys, eval_len=n, seeds=1, ppl_mean=p, ppl_std=None) for n, p in [(256, ppl_256), (512, ppl_512)]
        ]
        results = [dict(keys, eval_len=n, tokens=tokens, seed=0, run_dir="rope0") for n in (256, 512)]
        return summary, results

    evaluations = [
        evaluation(None, "nonoverlapping", 245568, 200.0, 250.0),  # +25.0%
        evaluation("yarn×4", "nonoverlapping", 245568, 220.0, 209.0),  # −5.0%
        evaluation("yarn×16", "nonoverlapping", 245568, 240.0, 240.0),
        evaluation("temp1.5", "nonoverlapping", 245568, 230.0, 230.0),
        evaluation("temp1.25", "nonoverlapping", 245568, 225.0, 225.0),
        evaluation(None, "sliding", 32767, 210.0, 273.0),  # +30.0%
    ]
    pd.DataFrame([row for summary, _ in evaluations for row in summary]).to_csv(tmp_path / "summary.csv", index=False)
    pd.DataFrame([row for _, results in evaluations for row in results]).to_csv(tmp_path / "results.csv", index=False)
    heading, _, *table = rows(str(tmp_path), "--variants")
    assert heading == ["encoding", "variant", "train_len", "evaluated as", "mode", "test tokens", "at train_len", "512"]
    assert table == [
        ["rope", "", "256", "as trained", "nonoverlapping", "245,568", "200.0", "250.0 (+25.0%)"],
        ["rope", "", "256", "as trained", "sliding", "32,767", "210.0", "273.0 (+30.0%)"],
        ["rope", "", "256", "temp1.25", "nonoverlapping", "245,568", "225.0", "225.0 (+0.0%)"],
        ["rope", "", "256", "temp1.5", "nonoverlapping", "245,568", "230.0", "230.0 (+0.0%)"],
        ["rope", "", "256", "yarn×4", "nonoverlapping", "245,568", "220.0", "209.0 (−5.0%)"],
        ["rope", "", "256", "yarn×16", "nonoverlapping", "245,568", "240.0", "240.0 (+0.0%)"],
    ]


def test_mixed_training_lengths_stay_in_one_cell(tmp_path):
    summary = [dict(point("rope", None, n, 230.0, seeds=1), train_lengths="64|128|256") for n in (256, 512)]
    pd.DataFrame(summary).to_csv(tmp_path / "summary.csv", index=False)
    results = [dict(encoding="rope", variant=None, train_len=256, train_lengths="64|128|256", split="test",
                    eval_mode="nonoverlapping", eval_len=n, seed=0, stopped_step=2400, best_step=2000, run_dir="rope0")
               for n in (256, 512)]  # fmt: skip
    pd.DataFrame(results).to_csv(tmp_path / "results.csv", index=False)
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, check=True)
    heading, _, row = done.stdout.splitlines()
    assert "trained at" in heading and r"| 64\|128\|256 |" in row
    assert row.replace(r"\|", "").count("|") == heading.count("|")


def test_a_closed_pipe_ends_it_quietly(tmp_path, into_closed_pipe):
    done = into_closed_pipe([sys.executable, SCRIPT, write_report(tmp_path)])
    assert done.returncode == -signal.SIGPIPE and done.stderr == ""


def test_copy_prints_accuracy_by_distance_of_the_restricted_spans_and_each_seeds_reach(tmp_path):
    def copy_row(encoding, seed, distance, accuracy, vocab=None):
        return dict(encoding=encoding, variant=None, train_len=256, train_lengths="256", seed=seed,
                    distance=distance, vocab=vocab, accuracy=accuracy, status="ok")  # fmt: skip

    copies = [copy_row("alibi", s, d, a, 128) for s, accs in [(0, [0.8, 0.9, 0.7, 0.5]), (1, [0.6, 0.7, 0.5, 0.1])]
              for d, a in zip([0, 64, 192, 512], accs)]  # fmt: skip
    copies += [copy_row("alibi", 0, d, 0.0) for d in (0, 512)]  # every word's spans: not the table's
    copies += [copy_row("rope", 0, d, 0.01) for d in (0, 16, 64, 1024)]  # one accuracy inside: no range
    copies.append(copy_row("rope", 0, 2048, None) | {"status": "unsupported"})  # not measured: an empty cell
    pd.DataFrame(copies).to_csv(tmp_path / "copy_probe.csv", index=False)
    probes = [dict(encoding="alibi", variant=None, train_len=256, train_lengths="256", seed=s, copy_reach=None,
                   copy_reach_vocab=r) for s, r in [(1, 192), (0, 1024)]]  # fmt: skip
    probes.append(dict(encoding="rope", variant=None, train_len=256, train_lengths="256", seed=0, copy_reach=None))
    pd.DataFrame(probes).to_csv(tmp_path / "probes.csv", index=False)
    heading, _, alibi, rope = rows(str(tmp_path), "--copy")
    assert heading[4:9] == ["spans of", "accuracy at d = 0", "0 < d < train_len", "d = 2×", "d = 4×"]
    assert alibi == ["alibi", "", "256", "2", "128 words", "0.70 ± 0.14", "0.60–0.80", "0.30 ± 0.28",
                     "", "", "", "", "1,024; 192"]  # fmt: skip
    assert rope == ["rope", "", "256", "1", "every word", "0.01", "0.01", "", "0.01", "", "", "", "no_copying"]
