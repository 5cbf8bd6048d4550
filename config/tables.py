"""Plain-text tables for the commands' output (`config check`, `status`, the tiering summary).

Here, the lowest layer, because the pipeline and the command both print them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

__all__ = ("text_table",)


def text_table(rows: Sequence[Sequence[str]], *, right_aligned: Collection[int] = ()) -> list[str]:
    """`rows` (the header first) as lines: columns two spaces apart, each as wide as its
    widest cell, padded on the right, or on the left for the column indexes in
    `right_aligned` (numbers); no trailing blanks."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.rjust(width) if i in right_aligned else cell.ljust(width)
                  for i, (cell, width) in enumerate(zip(row, widths))).rstrip()
        for row in rows
    ]
