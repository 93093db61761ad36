"""The one Markdown-table writer: the report's summary.md, the TensorBoard text summary and bench.md."""

from __future__ import annotations

from typing import Collection, Iterable, Sequence


def markdown_table(header: Sequence, rows: Iterable[Sequence], right: Collection[str] = ()) -> str:
    """A GitHub Markdown table of ``header`` and ``rows``, every cell written with ``str``.

    Columns whose header is in ``right`` are right-aligned (numbers); the others keep the default.
    """
    header = [str(name) for name in header]
    rule = "|" + "".join("---:|" if name in right else "---|" for name in header)
    return "\n".join([table_row(header), rule, *(table_row(row) for row in rows)])


def table_row(cells: Iterable) -> str:
    """One row; a ``|`` inside a cell (train_lengths ``64|128|256``) is escaped so it does not end the cell."""
    return "| " + " | ".join(str(cell).replace("|", r"\|") for cell in cells) + " |"
