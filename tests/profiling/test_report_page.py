"""profiling/report_page.py: every run folder's index.html, from a CPU run, from the
recorded GPU runs' summaries (one and two ranks), from a failed run; and in Chromium."""

import json
import re
import shutil

import pytest

import train
from profiling import report_page
from tests.helpers import REPO, TINY

FIXTURES = REPO / "tests" / "fixtures"


def _links(page: str) -> list[str]:
    return re.findall(r"(?:href|src)='([^']+)'", page)


def test_a_cpu_runs_page_lays_out_what_it_printed(tmp_path):
    train.run(train.parse_config(TINY + ["--out-dir", str(tmp_path), "--run-name", "run"]))
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    page = (run / "index.html").read_text()
    title, rows, facts = report_page.split_table(summary["table"])
    assert f"<h1>{title}</h1>" in page and "<th>GPU ms/step</th>" in page
    assert page.count("<tr>") == len(rows) - 1  # the head and the body, less |---|
    assert all(report_page._e(f) in page for f in facts) and "sustained:" in page
    assert summary["environment"]["commit"][:7] in page
    # Every link and image is a file of the folder; nothing is fetched from anywhere.
    assert _links(page) and all((run / name).is_file() for name in _links(page))
    assert "<script" not in page and "http" not in re.sub(r"<code>[^<]*</code>", "", page)


@pytest.mark.parametrize("name", ["kernel", "padded", "graph", "ddp"])
def test_the_recorded_gpu_runs_pages(tmp_path, name):
    summary = json.loads((FIXTURES / f"gpu_{name}_train.summary.json").read_text())
    for trace in [summary["trace"]] + [r["trace"] for r in
                                       summary.get("distributed", {}).get("ranks", [])]:
        (tmp_path / trace).write_bytes(b"")
    page = report_page.page(tmp_path, summary)
    assert summary["environment"]["device"] in page and "<b>step</b>" in page
    assert all((tmp_path / link).exists() or link == "summary.json" for link in _links(page))
    if name == "ddp":  # both ranks' traces
        assert sum(link.startswith("rank") for link in _links(page)) == 2


def test_a_failed_runs_page_says_so_first(tmp_path):
    page = report_page.page(tmp_path, {"status": "failed", "reason": "the disk is full"})
    assert "This run is <b>failed</b>: the disk is full" in page
    assert "<table>" not in page  # no table was printed


def test_a_studys_page_lays_out_its_markdown_and_links_its_runs(tmp_path):
    (tmp_path / "padded-train").mkdir()
    (tmp_path / "padded-train" / "index.html").write_text("<html></html>")
    (tmp_path / "steps.png").write_bytes(b"")
    markdown = ("**Interrupted** after 1 of 2 runs.\n\n| strategy | step ms |\n|---|---:|\n"
                "| padded | **19.5** |\n\nnote <b>not</b> markup\n")
    page = report_page.study_page(tmp_path, markdown)
    assert "<p><b>Interrupted</b> after 1 of 2 runs.</p>" in page
    assert "<tr><td>padded</td><td><b>19.5</b></td></tr>" in page
    assert "note &lt;b&gt;not&lt;/b&gt; markup" in page  # the text escaped
    assert "href='padded-train/index.html'" in page and "src='steps.png'" in page


@pytest.mark.browser
def test_a_runs_page_in_chromium(browser, tmp_path):
    """index.html as a person opens it (file://): the title, the table's cells and the
    footer on the screen; a screenshot is kept."""
    import os
    from pathlib import Path

    from selenium.webdriver.common.by import By
    run = tmp_path / "kernel"
    run.mkdir()
    summary = json.loads((FIXTURES / "gpu_kernel_train.summary.json").read_text())
    shutil.copy(FIXTURES / "gpu_kernel_train.pt.trace.json.gz", run / summary["trace"])
    page = report_page.write(run, summary)
    browser.get(page.as_uri())
    body = browser.find_element(By.TAG_NAME, "body").text
    title, rows, _ = report_page.split_table(summary["table"])
    assert title in body and "backward" in body and "Open the trace" in body
    cells = browser.find_elements(By.TAG_NAME, "td")
    assert len(cells) == 6 * (len(rows) - 2) and all(c.size["width"] > 0 for c in cells)
    shots = Path(os.environ.get("SCREENSHOT_DIR", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(shots / "run-page.png"))
