"""Bench tables: aligned columns separated by ``|``, a Markdown table that also reads well in a terminal
(the docs paste them as they are)."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; text left-aligned, numbers right-aligned ('-' and 'n/a' fit either)."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    if any(len(r) != len(header) for r in cells):
        raise ValueError("every row needs one cell per header column")
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    right = [_numeric_column([r[i] for r in cells[1:]]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right)) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if r else ("-" * (w + 2)) for w, r in zip(widths, right)) + "|"
    return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])


PLACEHOLDERS = ("", "-", "n/a")


def _numeric_column(column: list[str]) -> bool:
    """Numbers (possibly with a unit or a 'p50 / p99' pair) in every cell that is not a placeholder."""
    values = [c.strip() for c in column if c.strip() not in PLACEHOLDERS]
    return bool(values) and all(_numeric(v) for v in values)


def _numeric(text: str) -> bool:
    return text[0].isdigit() or (text[0] in "+-." and len(text) > 1 and text[1].isdigit())
