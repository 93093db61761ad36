"""``posbench report DIR [compare=ENCODING] [variants=LIST] [modes=LIST]``: tables and figures from every run below
DIR (``report`` says which).

It reads words, not Hydra overrides (a folder is no config): ``parse`` turns them into its ``ReportConfig``,
which ``check`` checks and ``run`` runs.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass

from ..errors import raise_problems
from ..report import Selection, report

#: The options after ``report DIR``, as the one-line error names them.
OPTIONS = ("compare=ENCODING", "variants=LIST", "modes=LIST")


@dataclass
class ReportConfig:
    #: A run or multirun folder, searched recursively for results.csv.
    dir: str
    #: The KEY=VALUE words after DIR (``report_options`` reads them).
    options: list[str]
    debug: bool = False


def parse(args: list[str]) -> ReportConfig:
    """The words after ``report`` (argparse: ``--help`` and a missing DIR are its own)."""
    parser = argparse.ArgumentParser(
        prog="python -m posbench report", description="Tables and figures from a folder of runs."
    )
    parser.add_argument("dir", help="a run or multirun folder, searched recursively for results.csv")
    parser.add_argument(
        "options",
        nargs="*",
        metavar="KEY=VALUE",
        help="compare=ENCODING: NLL differences against ENCODING on the same articles, bootstrap CIs; "
        "variants=V1,V2: keep only these evaluation-time variants beside the models as trained "
        "(variants= keeps none); modes=M1,M2: keep only these eval modes (nonoverlapping, sliding)",
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    ns = parser.parse_args(args)
    return ReportConfig(ns.dir, ns.options, ns.debug)


def option_problems(words: list[str]) -> list[str]:
    """Every word after DIR that is not one of ``OPTIONS``, and every key given twice."""
    found, given = [], set()
    for word in words:
        key, equals, value = word.partition("=")
        if key not in ("compare", "variants", "modes") or not equals or not (value or key == "variants"):
            found.append(f"report takes DIR and {', '.join(OPTIONS)}, not {word!r}")
        elif key in given:
            found.append(f"report: {key}= given twice")
        else:
            given.add(key)
    return found


def check(cfg: ReportConfig) -> None:
    """Every problem of the words after DIR at once (DIR itself is ``report``'s to judge)."""
    raise_problems(option_problems(cfg.options))


def report_options(words: list[str]) -> tuple[str | None, Selection]:
    """The ``compare`` encoding (None without one) and the ``Selection`` of the KEY=VALUE words after
    ``report DIR``; each key once."""
    raise_problems(option_problems(words))
    given = dict(word.split("=", 1) for word in words)
    lists = {key: tuple(v for v in given[key].split(",") if v) for key in ("variants", "modes") if key in given}
    return given.get("compare"), Selection(**lists)


def run(cfg: ReportConfig) -> None:
    """Write DIR/report/ and say where."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    compare, selection = report_options(cfg.options)
    print(f"report written to {report(cfg.dir, compare=compare, selection=selection)}")
