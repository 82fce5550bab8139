"""Markdown and CSV tables: how every table this project writes is laid out (a run's own
step-time table, profiling/table.py, keeps its fixed-width terminal form).

    markdown(["strategy", "GPU ms"], [["padded", 0.25]], left={"strategy"})
    csv_text(["strategy", "GPU ms"], [{"strategy": "padded", "GPU ms": 0.25}])
"""

import csv
import io


def cell(value) -> str:
    """A value as a table shows it: '-' for none, 3 decimals below 1000, none above."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
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
