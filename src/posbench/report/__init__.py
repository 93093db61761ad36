"""``posbench report DIR``: tables and figures from the CSVs of every run below DIR.

Reads CSVs only, never trains. Writes DIR/report/: results.csv (every usable row), summary.csv (mean and std over
seeds), summary.md, and ppl_vs_length, per_position_loss and training_curves as PNG and SVG; where runs have probe
CSVs, probes.csv (derived numbers per run), copy_probe.csv (the copy probe's rows of every run), their tables in
summary.md and their figures; with ``compare=ENCODING``, compare.csv (paired differences in NLL against that encoding,
with bootstrap CIs) and its tables in summary.md; a ``Selection`` (``variants=``, ``modes=``) keeps some evaluations
only, in every file. Task runs (task_results.csv) add task_results.csv, task_summary.csv, their tables in summary.md
and task_<name> figures (``tasks``); the generation.csv of ``posbench generate`` adds generation_summary.csv, its
tables and the figure ``generation`` (``generation``). ``collect`` reads, ``tables``, ``probes`` and ``compare``
compute, ``figures`` and ``probe_figures`` draw.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import PosbenchError
from ..io import write_csv, write_text
from ..runfolder import (
    BUILDING_PREFIX,
    COPY_CSV,
    LOCK_FILE,
    PER_ARTICLE,
    PROBE_IDENTITY,
    REPORT_DIR,
    REPORT_MARK,
    RESULTS,
)
from .collect import KEEP_ALL, Runs, Selection, collect_results, collect_runs
from .compare import compare_markdown, compare_runs
from .figures import draw_figures, encoding_colours
from .generation import collect_generation, draw_generation_figure, generation_markdown, generation_summary, with_models
from .probe_figures import draw_probe_figures
from .probes import probe_markdown, probe_numbers
from .selection import variants_in
from .tables import aggregate, normalise, splits, summary_markdown, unlabelled_single_precision
from .tasks import (
    collect_tasks,
    draw_learning_curves,
    draw_task_figures,
    draw_task_heatmaps,
    task_markdown,
    task_summary,
    tasks_markdown,
)

__all__ = ["REPORT_DIR", "Runs", "Selection", "collect_results", "collect_runs", "report"]


def report(root: Path, compare: str | None = None, selection: Selection = KEEP_ALL) -> Path:
    """Write DIR/report/: results.csv (every row), summary.csv (mean, std per point), summary.md, figures;
    compare.csv with ``compare`` (the reference encoding); of the evaluations ``selection`` keeps.

    All or nothing: the files are built beside DIR/report and replace it only once all are written.
    """
    root = Path(root)
    if not root.is_dir():
        raise PosbenchError(f"{root} is not a folder")
    out = root / REPORT_DIR
    check_own(out)
    remove_abandoned_builds(root)
    tasks, tasks_left_out = collect_tasks(root)
    generated, generation_left_out = collect_generation(root)
    beside = frozenset(variants_in(tasks) | variants_in(generated))  # a selection may name their variants too
    runs = collect_runs(root, selection, required=tasks.empty, found=beside)
    tasks, generated = selection.rows(tasks), with_models(selection.rows(generated), runs.reported)
    left_out = {**tasks_left_out, **generation_left_out, **runs.left_out}
    with replacing(out) as building:
        sections = generation_files(generated, building) + task_files(tasks, building)
        if runs.reported:
            text_files(root, runs, compare, building, sections, left_out)
        else:  # task runs alone
            write_text(tasks_markdown(root, tasks, sections, left_out), building / "summary.md")
    return out


def text_files(root: Path, runs: Runs, compare: str | None, building: Path, sections: list[str], left_out) -> None:
    """The report of the runs trained on text, with the task ``sections`` after its own."""
    results = normalise(runs.rows(RESULTS))
    summary = aggregate(results)
    probes = probe_numbers(runs.reported)
    write_csv(results, building / "results.csv")
    write_csv(summary, building / "summary.csv")
    if set(probes.columns) > set(PROBE_IDENTITY):  # some run has derived probe numbers
        write_csv(probes, building / "probes.csv")
    copies = runs.rows(COPY_CSV)
    if not copies.empty:  # the copy probe's rows, for tables of accuracy against distance
        write_csv(copies, building / COPY_CSV)
    shown, shown_summary = (unlabelled_single_precision(df, results) for df in (results, summary))
    shown_probes = probe_markdown(unlabelled_single_precision(probes, results) if len(probes) else probes)
    shown_compare = []
    if compare:
        compared = compare_runs(runs, compare, root)
        write_csv(compared, building / "compare.csv")
        uncompared = sum(PER_ARTICLE not in run.tables for run in runs.reported)
        shown_compare = compare_markdown(unlabelled_single_precision(compared, results), compare, uncompared)
    markdown = summary_markdown(
        root, shown, shown_summary, left_out, sections=[*shown_compare, *shown_probes, *sections]
    )
    write_text(markdown, building / "summary.md")
    draw_figures(runs, shown, shown_summary, splits(results)[0], building)
    draw_probe_figures(runs, encoding_colours(results["encoding"]), building, results)


def generation_files(generated, building: Path) -> list[str]:
    """generation_summary.csv (each measure by line and window, over samples), the figure ``generation``;
    returns summary.md's generation sections."""
    if generated.empty:
        return []
    summary = generation_summary(generated)
    write_csv(summary, building / "generation_summary.csv")
    draw_generation_figure(summary, encoding_colours(generated["encoding"]), building)
    return generation_markdown(generated)


def task_files(tasks, building: Path) -> list[str]:
    """task_results.csv and task_summary.csv (every task row; mean and std over seeds), the task figures;
    returns summary.md's task sections."""
    if tasks.empty:
        return []
    summary = task_summary(tasks)
    write_csv(tasks, building / "task_results.csv")
    write_csv(summary, building / "task_summary.csv")
    draw_task_figures(summary, encoding_colours(tasks["encoding"]), building)
    draw_task_heatmaps(summary, building)
    draw_learning_curves(tasks, encoding_colours(tasks["encoding"]), building)
    return task_markdown(summary, tasks)


#: The files a report writes: any other entry in DIR/report is not the report's to replace.
REPORT_FILES = ("*.csv", "*.md", "*.png", "*.svg", REPORT_MARK, LOCK_FILE)


def check_own(out: Path) -> None:
    """``out`` (DIR/report) is absent or holds a report's files only: anything else there is the user's, and the
    report stops rather than replace it."""
    if not out.exists() and not out.is_symlink():
        return
    if out.is_symlink() or not out.is_dir():
        raise PosbenchError(f"{out} is not a report folder posbench made; move it aside, then report again")
    foreign = [p.name for p in out.iterdir() if not (p.is_file() and any(p.match(g) for g in REPORT_FILES))]
    if foreign:
        shown = ", ".join(sorted(foreign)[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise PosbenchError(f"{out} holds what a report does not write ({shown}); move it aside, then report again")


def remove_abandoned_builds(root: Path) -> None:
    """Remove the folders of reports that were killed while building beside DIR/report (no process holds
    their lock any more)."""
    for folder in root.glob(f"{BUILDING_PREFIX}*"):
        if folder.is_dir() and not folder.is_symlink() and (folder / REPORT_MARK).is_file() and unlocked(folder):
            shutil.rmtree(folder, ignore_errors=True)


def unlocked(folder: Path) -> bool:
    """Whether no process holds ``folder``'s lock (a report being built holds it to its end)."""
    try:
        with open(folder / LOCK_FILE, "a") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


@contextmanager
def replacing(target: Path) -> Iterator[Path]:
    """An empty folder beside ``target`` to fill; once filled it takes ``target``'s place. If filling fails
    it is removed and ``target`` keeps what it held."""
    building = Path(tempfile.mkdtemp(dir=target.parent, prefix=BUILDING_PREFIX, suffix=".tmp"))
    try:
        umask = os.umask(0)
        os.umask(umask)
        building.chmod(0o777 & ~umask)  # mkdtemp makes 0700; give the report ordinary permissions
        (building / REPORT_MARK).write_text("made by posbench report: replaced whole by the next one\n")
        with open(building / LOCK_FILE, "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # a later report leaves a build in progress alone
            yield building
            take_place(building, target)
    finally:
        shutil.rmtree(building, ignore_errors=True)


def take_place(building: Path, target: Path) -> None:
    """``building`` becomes ``target``; the old ``target`` is removed only once it has."""
    previous = building.with_name(building.name + ".previous")
    if target.exists():
        os.replace(target, previous)
    try:
        os.replace(building, target)
    except OSError:
        if previous.exists():
            os.replace(previous, target)
        raise
    if previous.exists():
        shutil.rmtree(previous)
