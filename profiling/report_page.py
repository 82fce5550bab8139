"""A run folder's index.html (write) and a study's (write_study): one page a person opens
from the disk, with no script and no style or font fetched: what the run printed, where it
ran, its charts, links to the trace, the memory page and summary.json, and the commands
that open the trace. Written whatever the run's status, which it says first. The design
in full: docs/design.md, this module's section."""

import html
from pathlib import Path

from core.files import write_whole

PAGE = "index.html"
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1100px;
       color: #222; padding: 0 16px }
h1 { font-size: 20px } h2 { font-size: 16px; margin-top: 28px }
table { border-collapse: collapse; font: 13px ui-monospace, monospace }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right }
td:first-child, th:first-child { text-align: left }
.status { padding: 6px 12px; background: #fff3cd; border: 1px solid #ffe69c }
.facts li { margin: 3px 0 } code, pre { background: #f4f4f4; padding: 1px 4px }
pre { padding: 8px; overflow-x: auto } .wide { overflow-x: auto }
img { max-width: 100%; border: 1px solid #ddd }
"""


def write(folder: Path, summary: dict) -> Path:
    """Writes folder/index.html (whole or not at all); returns its path."""
    path = folder / PAGE
    write_whole(path, page(folder, summary))
    return path


def page(folder: Path, summary: dict) -> str:
    title, table, facts = split_table(summary.get("table") or "")
    env = summary.get("environment") or {}
    status = summary.get("status", "complete")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'>"
             f"<title>{_e(title or folder.name)}</title><style>{STYLE}</style></head><body>",
             f"<h1>{_e(title or folder.name)}</h1>"]
    if status != "complete":
        reason = summary.get("reason")
        parts.append(f"<p class=status>This run is <b>{_e(status)}</b>"
                     + (f": {_e(reason)}" if reason else "") + "</p>")
    parts.append(f"<p>{_e(where(env))}</p>")
    if table:
        parts.append(table_html(table))
    if facts:
        parts.append("<ul class=facts>" + "".join(f"<li>{_e(f)}</li>" for f in facts) +
                     "</ul>")
    parts += charts(folder) + files(folder, summary) + commands(folder, summary)
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_study(folder: Path, markdown: str) -> Path:
    """Writes a study's folder/index.html from the markdown it printed and wrote."""
    path = folder / PAGE
    write_whole(path, study_page(folder, markdown))
    return path


def study_page(folder: Path, markdown: str) -> str:
    """The study's markdown laid out (headings, tables, paragraphs), its charts, and the
    runs it made whose folders hold a page of their own."""
    title = next((line.lstrip("#").strip() for line in markdown.splitlines()
                  if line.startswith("#")), folder.name)
    body, rows = [], []
    for line in markdown.splitlines() + [""]:
        if line.startswith("|"):
            rows.append(line)
            continue
        if rows:
            body.append(table_html(rows))
            rows = []
        if line.startswith("#"):
            body.append(f"<h2>{_bold(line.lstrip('#').strip())}</h2>")
        elif line.strip():
            body.append(f"<p>{_bold(line.strip())}</p>")
    runs = sorted(p.parent.name for p in folder.glob(f"*/{PAGE}"))
    links = ["<h2>Runs</h2><ul>", *(f"<li><a href='{_e(r)}/{PAGE}'>{_e(r)}</a></li>"
                                    for r in runs), "</ul>"] if runs else []
    return "\n".join([f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}"
                      f"</title><style>{STYLE}</style></head><body><h1>{_e(folder.name)}</h1>",
                      *body, *charts(folder), *links, "</body></html>\n"])


def _bold(text: str) -> str:
    """Escaped, with markdown's **x** in bold."""
    parts = _e(text).split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


def split_table(text: str) -> tuple[str, list[str], list[str]]:
    """(the '### ' title, the markdown table's rows, the footer's lines) of a run's
    printed table."""
    title, rows, facts = "", [], []
    for line in text.splitlines():
        if line.startswith("### "):
            title = line[4:]
        elif line.startswith("|"):
            rows.append(line)
        elif line.strip():
            facts.append(line.strip())
    return title, rows, facts


def table_html(rows: list[str]) -> str:
    """A markdown table as HTML: the first row the head, the |---| row dropped, '**x**'
    in bold. A table cut short (one row) is its head alone."""
    def cells(row: str) -> list[str]:
        return [c.strip() for c in row.strip().strip("|").split("|")]

    def cell(text: str, tag: str) -> str:
        return f"<{tag}>{_bold(text)}</{tag}>"
    body = [r for r in rows[1:] if not set(r.replace("|", "").strip()) <= set("-: ")]
    head = "".join(cell(c, "th") for c in cells(rows[0]))
    lines = "".join("<tr>" + "".join(cell(c, "td") for c in cells(r)) + "</tr>" for r in body)
    return (f"<div class=wide><table><thead><tr>{head}</tr></thead><tbody>{lines}</tbody>"
            "</table></div>")


def where(env: dict) -> str:
    """Device, versions, commit and date, as far as the record has them."""
    commit = env.get("commit") or "not recorded"
    if env.get("dirty"):
        commit += " (with uncommitted changes)"
    return (f"{env.get('device', 'device not recorded')}; torch {env.get('torch', '?')}, "
            f"Triton {env.get('triton') or '-'}, CUDA {env.get('cuda') or '-'}, Python "
            f"{env.get('python', '?')}; commit {commit}; {env.get('date', 'date not recorded')}")


def charts(folder: Path) -> list[str]:
    pngs = sorted(folder.glob("*.png"))
    return ["<h2>Charts</h2>", *(f"<p><img src='{_e(p.name)}' alt='{_e(p.stem)}'></p>"
                                 for p in pngs)] if pngs else []


def files(folder: Path, summary: dict) -> list[str]:
    """Links to what the folder holds: the trace(s), the memory page, summary.json."""
    names = [summary.get("trace")] + [r.get("trace") for r in
                                      (summary.get("distributed") or {}).get("ranks", [])
                                      if isinstance(r, dict)]
    traces = [n for n in dict.fromkeys(names) if n and (folder / n).exists()]
    links = [(n, "the profiler's trace") for n in traces]
    memory = (summary.get("memory") or {}).get("page")
    if memory and (folder / memory).exists():
        links.append((memory, "the GPU memory by category"))
    links.append(("summary.json", "every figure, the config and the environment"))
    return ["<h2>Files</h2><ul>", *(f"<li><a href='{_e(n)}'>{_e(n)}</a>: {_e(what)}</li>"
                                    for n, what in links), "</ul>"]


def commands(folder: Path, summary: dict) -> list[str]:
    """How to open the trace: the folder may be renamed (-failed, -interrupted) after
    the page is written, so the trace is named within it and TensorBoard's logdir is the
    folder's parent, which a rename keeps."""
    trace = summary.get("trace") or "the trace"
    return ["<h2>Open the trace</h2>",
            f"<pre>make tensorboard LOGDIR={_e(str(folder.absolute().parent))}   # then "
            "the PYTORCH_PROFILER tab</pre>",
            f"<p>In Perfetto: open <code>https://ui.perfetto.dev</code> and drop this "
            f"folder's <code>{_e(trace)}</code> on it (it reads the gzip file as it is; "
            "the trace stays on this machine).</p>"]


def _e(text) -> str:
    return html.escape(str(text), quote=True)
