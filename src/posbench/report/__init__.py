"""``posbench report DIR``: tables and figures from the CSVs of every run below DIR.

Reads CSVs only, never trains. Writes DIR/report/: results.csv (every usable row), summary.csv
(mean and std over seeds), summary.md, and ppl_vs_length, per_position_loss and training_curves
as PNG and SVG; where runs have probe CSVs, probes.csv (derived numbers per run), their tables in
summary.md and their figures; with ``compare=ENCODING``, compare.csv (paired differences in NLL against that
encoding, with bootstrap CIs) and its tables in summary.md; a ``Selection`` (``variants=``, ``modes=``)
keeps some evaluations only, in every file. ``collect`` reads, ``tables``, ``probes`` and
``compare`` compute, ``figures`` and ``probe_figures`` draw.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import PosbenchError
from ..evaluate import PER_ARTICLE
from ..io import write_csv, write_text
from ..probes.suite import IDENTITY
from .collect import BUILDING_PREFIX, KEEP_ALL, REPORT_DIR, RESULTS, Runs, Selection, collect_results, collect_runs
from .compare import compare_markdown, compare_runs
from .figures import draw_figures, encoding_colours
from .probe_figures import draw_probe_figures
from .probes import probe_markdown, probe_numbers
from .tables import aggregate, normalise, splits, summary_markdown, unlabelled_single_precision

__all__ = ["REPORT_DIR", "Runs", "Selection", "collect_results", "collect_runs", "report"]


def report(root: Path, compare: str | None = None, selection: Selection = KEEP_ALL) -> Path:
    """Write DIR/report/: results.csv (every row), summary.csv (mean, std per point), summary.md, figures;
    compare.csv with ``compare`` (the reference encoding); of the evaluations ``selection`` keeps.

    All or nothing: the files are built beside DIR/report and replace it only once all are written.
    """
    root = Path(root)
    if not root.is_dir():
        raise PosbenchError(f"{root} is not a folder")
    runs = collect_runs(root, selection)
    results = normalise(runs.rows(RESULTS))
    summary = aggregate(results)
    probes = probe_numbers(runs.reported)
    compared = compare_runs(runs, compare, root) if compare else None
    out = root / REPORT_DIR
    with replacing(out) as building:
        write_csv(results, building / "results.csv")
        write_csv(summary, building / "summary.csv")
        if set(probes.columns) > set(IDENTITY):  # some run has derived probe numbers
            write_csv(probes, building / "probes.csv")
        shown, shown_summary = (unlabelled_single_precision(df, results) for df in (results, summary))
        shown_probes = probe_markdown(unlabelled_single_precision(probes, results) if len(probes) else probes)
        shown_compare = []
        if compared is not None:
            write_csv(compared, building / "compare.csv")
            uncompared = sum(PER_ARTICLE not in run.tables for run in runs.reported)
            shown_compare = compare_markdown(unlabelled_single_precision(compared, results), compare, uncompared)
        sections = [*shown_compare, *shown_probes]
        markdown = summary_markdown(root, shown, shown_summary, runs.left_out, sections=sections)
        write_text(markdown, building / "summary.md")
        draw_figures(runs, shown, shown_summary, splits(results)[0], building)
        draw_probe_figures(runs, encoding_colours(results["encoding"]), building, results)
    return out


@contextmanager
def replacing(target: Path) -> Iterator[Path]:
    """An empty folder beside ``target`` to fill; once filled it takes ``target``'s place. If filling fails
    it is removed and ``target`` keeps what it held."""
    building = Path(tempfile.mkdtemp(dir=target.parent, prefix=BUILDING_PREFIX, suffix=".tmp"))
    try:
        umask = os.umask(0)
        os.umask(umask)
        building.chmod(0o777 & ~umask)  # mkdtemp makes 0700; give the report ordinary permissions
        yield building
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
    finally:
        shutil.rmtree(building, ignore_errors=True)
