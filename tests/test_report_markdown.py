"""The one Markdown-table writer behind summary.md, the TensorBoard text summary and bench.md."""

from posbench.markdown import markdown_table


def test_header_rule_and_rows_with_every_cell_as_str():
    table = markdown_table(["encoding", 4, "note"], [["alibi", 12.5, ""], ["rope", None, "x"]])
    assert table.splitlines() == [
        "| encoding | 4 | note |",
        "|---|---|---|",
        "| alibi | 12.5 |  |",
        "| rope | None | x |",
    ]


def test_named_columns_are_right_aligned():
    table = markdown_table(["encoding", "tok/s", "note"], [], right={"tok/s", "absent"})
    assert table.splitlines() == ["| encoding | tok/s | note |", "|---|---:|---|"]
