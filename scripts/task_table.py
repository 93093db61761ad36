"""Print the task table of docs/results.md from a report folder: one row per model, the step it learned its task,
and for each eval_len the accuracy with the source right before the query (d = 0, or ``--near D``) and at the
start of the sequence (the longest distance), as ``near / longest``.

    python scripts/task_table.py docs/results/runs/tasks0/report --task passkey
    python scripts/task_table.py docs/results/runs/tasks0/report --task copy --near 16
    python scripts/task_table.py REPORT_OF_SEVERAL_SEEDS --task passkey --reach 0.9
    python scripts/task_table.py REPORT_OF_SEVERAL_SEEDS --task copy --reach 0.9 --inside

Reads the report's task_summary.csv and task_results.csv (what ``posbench report`` writes): means over the seeds
that learned the task; a model no seed learned gets ``not learned`` and the best validation accuracy.
With ``--reach A`` it prints instead, for each seed, the longest multiple of train_len up to which the answer is
found at every distance with accuracy at least A, at that length and every shorter one (``< 1×``: not even at
train_len; ``not learned``: the seed did not learn the task; empty: no such seed). ``--inside`` counts only
the distances inside the filler, leaving out d = 0 and the longest (the source at the very start): what is
left where a model finds the source by the filler around it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from posbench.markdown import markdown_table
from posbench.report.tasks import seeds_learned, task_runs

MODEL = ["encoding", "variant", "train_len"]


def cell(group: pd.DataFrame, near: int) -> str:
    """``near / longest`` of one (model, eval_len); ``unsupported`` when the encoding cannot serve the length."""
    if (group["unsupported"] > 0).all():
        return "unsupported"
    by_distance = group.set_index("distance")["accuracy_mean"]
    return f"{by_distance.loc[near]:.2f} / {by_distance.loc[by_distance.index.max()]:.2f}"


def learned(results: pd.DataFrame, task: str) -> str:
    """The seeds that learned the task, and the first validation step at which each did."""
    runs = task_runs(results, task)
    if not runs["learned"].any():
        return f"not learned (best {runs['valid_accuracy'].max():.3f})"  # 3 digits: 0.945 is not 0.95
    steps = ", ".join(f"{int(step):,}" for step in sorted(runs.loc[runs["learned"], "learned_step"].dropna()))
    return f"{seeds_learned(runs)} (step {steps})" if steps else seeds_learned(runs)  # a variant: not trained


def read(report: Path, name: str) -> pd.DataFrame:
    # the variant as trained is empty: read as text, so that it is a group of its own
    return pd.read_csv(report / name, dtype={"variant": str}).fillna({"variant": ""})


def model_name(model: tuple) -> str:
    return model[0] + (f" ({model[1]})" if model[1] else "")


def table(summary: pd.DataFrame, results: pd.DataFrame, task: str, near: int = 0) -> str:
    summary = summary[summary["task"] == task]
    lengths = sorted(summary["eval_len"].unique())
    rows = []
    for model, group in summary.groupby(MODEL, sort=True):
        learned_by = learned(results[(results[MODEL] == pd.Series(model, index=MODEL)).all(axis=1)], task)
        seen = group["seeds"].max() > 0
        cells = [cell(group[group["eval_len"] == n], near) if seen else "" for n in lengths]
        rows.append([model_name(model), learned_by, *cells])
    train_len = int(summary["train_len"].iloc[0])
    header = ["encoding", "learned"] + [f"{n} ({n // train_len}×)" for n in lengths]
    return markdown_table(header, rows)


def seed_reach(run: pd.DataFrame, threshold: float, inside: bool = False) -> str:
    """One run's reach: the longest eval_len, as a multiple of train_len, of an unbroken run of lengths from the
    shortest at which every distance (``inside``: but d = 0 and each length's longest) was served and found
    with accuracy >= threshold."""
    if (run["status"] == "not_learned").any():
        return "not learned"
    if inside:
        longest = run.groupby("eval_len")["distance"].transform("max")
        run = run[(run["distance"] > 0) & (run["distance"] < longest)]
    found = ((run["status"] == "ok") & (run["accuracy"] >= threshold)).groupby(run["eval_len"]).all()
    held = found.cummin()  # an unbroken run from the shortest length: a later pass does not resume reach
    return f"{held[held].index.max() // int(run['train_len'].iloc[0])}×" if held.any() else "< 1×"


def reach_table(results: pd.DataFrame, task: str, threshold: float, inside: bool = False) -> str:
    results = results[results["task"] == task]
    seeds = sorted(results["seed"].unique())
    rows = []
    for model, group in results.groupby(MODEL, sort=True):
        by_seed = {seed: seed_reach(run, threshold, inside) for seed, run in group.groupby("seed")}
        rows.append([model_name(model), *(by_seed.get(s, "") for s in seeds)])
    return markdown_table(["encoding", *(f"seed {s}" for s in seeds)], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a report folder (posbench report DIR writes DIR/report)")
    parser.add_argument("--task", required=True)
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--near", type=int, default=0, help="the near distance shown beside the longest (0)")
    shown.add_argument("--reach", type=float, help="print each seed's reach at this accuracy instead")
    parser.add_argument("--inside", action="store_true", help="--reach over 0 < d < the longest distance only")
    args = parser.parse_args()
    if args.inside and args.reach is None:
        parser.error("--inside applies to --reach")
    try:
        summary, results = read(args.report, "task_summary.csv"), read(args.report, "task_results.csv")
    except OSError as error:  # not a report folder, or a report of no task runs
        parser.error(f"{args.report}: {error}")
    if args.task not in set(summary["task"]):
        parser.error(f"no {args.task} rows in {args.report}")
    if args.reach is not None:
        if not 0 < args.reach <= 1:
            parser.error("--reach must be in (0, 1]")
        print(reach_table(results, args.task, args.reach, args.inside))
        return
    if args.near not in set(summary.loc[summary["task"] == args.task, "distance"]):
        parser.error(f"no {args.task} row at distance {args.near}")
    print(table(summary, results, args.task, args.near))


if __name__ == "__main__":
    main()
