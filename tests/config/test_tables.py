"""The commands' plain-text tables."""

from __future__ import annotations

from tierproxy.config.tables import text_table


def test_columns_as_wide_as_their_widest_cell_two_spaces_apart():
    rows = [("PARTITION", "LX", "NOTE"), ("orders-0", "12345", "ok"), ("t-1", "7", "")]
    assert text_table(rows) == [
        "PARTITION  LX     NOTE",
        "orders-0   12345  ok",
        "t-1        7",  # no trailing blanks
    ]
    assert text_table(rows, right_aligned={1}) == [
        "PARTITION     LX  NOTE",
        "orders-0   12345  ok",
        "t-1            7",
    ]


def test_a_header_alone():
    assert text_table([("KEY", "VALUE", "SOURCE")]) == ["KEY  VALUE  SOURCE"]
