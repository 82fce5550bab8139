"""Markdown and CSV tables: how every table this project writes is laid out (a run's own
step-time table, profiling/table.py, keeps its fixed-width terminal form).

    markdown(["strategy", "GPU ms"], [["padded", 0.25]], left={"strategy"})
    csv_text(["strategy", "GPU ms"], [{"strategy": "padded", "GPU ms": 0.25}])
"""

import csv
import io
import math

# Significant digits a table shows: a time of 83.989 ms on a host that jitters by tenths
# reads 83.99, a GPU phase of 0.2513 ms 0.251; never more than 3 decimals (a microsecond
# of a time in ms, what the trace resolves).
DIGITS, MAX_DECIMALS = 4, 3


def cell(value) -> str:
    """A value as a table shows it, as it was measured: '-' for none, a whole number (a
    count: 379 launches, 1 sync) without decimals, else DIGITS significant digits
    (MAX_DECIMALS at most), none at 1000 and above."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value.is_integer() or abs(value) >= 1000:
            return f"{value:.0f}"
        whole = len(str(int(abs(value)))) if abs(value) >= 1 else 0
        return f"{value:.{max(0, min(MAX_DECIMALS, DIGITS - whole))}f}"
    return str(value)


def markdown(head: list[str], rows: list[list], left=()) -> str:
    """A Markdown table; numbers right-aligned, the columns named in `left` left-aligned.
    Cells that are not strings go through cell()."""
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join("---" if h in left else "---:" for h in head) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(c if isinstance(c, str) else cell(c) for c in row)
                     + " |")
    return "\n".join(lines)


def markdown_of_dicts(columns: list[str], rows: list[dict], left=()) -> str:
    """markdown() of rows given as dicts; a column a row lacks reads '-'."""
    return markdown(columns, [[cell(r.get(c)) for c in columns] for r in rows], left)


def csv_text(columns: list[str], rows: list[dict]) -> str:
    """CSV of rows given as dicts: a column a row lacks is empty, keys outside columns are
    left out."""
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, restval="", extrasaction="ignore",
                            lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
