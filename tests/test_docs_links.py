"""Every file the README, docs/ and results/README.md name exists: a markdown link's target
(relative to the page), and a path in backquotes whose first folder is one of the
repository's (`training/ranks.py`). A renamed or removed file left the docs pointing at
nothing (requirements-cpu.txt named profiling/tb_profiler_compat.py after it moved). A
link's #anchor names a heading of its page, in results/ and its archive too: a section
moved to the archive left links to it pointing at nothing."""

import re
from pathlib import Path

from tests.helpers import REPO

PAGES = [REPO / "README.md", REPO / "results" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
QUOTED = re.compile(r"`([\w.-]+/[\w./-]+\.(?:py|md|png|csv|json|txt|sh|cu|cpp|toml|html))`")
# A file that a page names as an example of what a user would add (docs/layout.md walks a
# new speed-up through).
EXAMPLES = {"training/speedups/triton_lin1_relu.py"}
TOP = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}


def named(page: Path) -> list[tuple[str, Path]]:
    """(as written, the path it names) of each file the page names."""
    text = page.read_text()
    found = []
    for target in LINK.findall(text):
        path = target.split("#", 1)[0]
        if path and "://" not in path and not path.startswith("mailto:"):
            found.append((target, (page.parent / path).resolve()))
    for path in QUOTED.findall(text):
        if path.split("/", 1)[0] in TOP and path not in EXAMPLES:
            found.append((path, REPO / path))
    return found


def test_every_file_a_doc_names_exists():
    missing = [f"{page.relative_to(REPO)}: {written}" for page in PAGES
               for written, path in named(page) if not path.exists()]
    assert not missing, missing


def test_a_missing_file_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("see [here](gone.md) and `training/nowhere.py`\n")
    assert [w for w, p in named(page) if not p.exists()] == ["gone.md", "training/nowhere.py"]


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to
    hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_anchors(pages) -> list[str]:
    """'page: link' of each link whose #anchor is no heading of the page it names."""
    found = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            path, _, anchor = target.partition("#")
            if not anchor or "://" in path:
                continue
            linked = (page.parent / path).resolve() if path else page
            headings = {slug(line.lstrip("#")) for line in linked.read_text().splitlines()
                        if line.startswith("#")} if linked.is_file() else set()
            if anchor not in headings:
                found.append(f"{page.name}: {target}")
    return found


def test_every_anchor_a_doc_links_to_is_a_heading():
    pages = PAGES + sorted((REPO / "results").rglob("*.md"))
    assert broken_anchors(pages) == []


def test_a_moved_section_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\n## An epoch (commit 690d2f1)\n")
    page = tmp_path / "b.md"
    page.write_text("[here](a.md#an-epoch-commit-690d2f1), [gone](a.md#one-h200), "
                    "[self](#b-top)\n\n# B top\n")
    assert broken_anchors([page]) == ["b.md: a.md#one-h200"]


NUMBERS = ("one two three four five six seven eight nine ten eleven twelve thirteen "
           "fourteen fifteen").split()


def test_the_readme_lists_every_strategy_the_registry_holds():
    """The README's count and its table of the ways follow core/names.py's registry: a
    strategy added there and not here fails this, not a reader."""
    from core.names import STRATEGIES
    text = (REPO / "README.md").read_text()
    count = NUMBERS[len(STRATEGIES) - 1]
    assert f"profiled {count} ways" in text.splitlines()[0]
    section = text.split(f"## The {count} ways", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `(\w+)` \|", section, re.M)
    assert listed == list(STRATEGIES)


def test_the_speedups_page_lists_every_speedup_in_the_ladders_order():
    """docs/speedups.md's table follows training/speedups' ORDER: a speed-up added there
    and not here fails this, not a reader."""
    from training.speedups import SPEEDUPS
    text = (REPO / "docs" / "speedups.md").read_text()
    listed = re.findall(r"^\| `(--[\w-]+)[ `]", text, re.M)
    assert listed == [s.flag for s in SPEEDUPS]


# "Its design in full: docs/design.md", "The design in full (...): docs/kernels.md, this
# module's section".
POINTER = re.compile(r"design in full[^:]*: (docs/[\w-]+\.md)|(docs/[\w-]+\.md), this module's")
SECTION = re.compile(r"^## `([\w/.]+\.py)`$", re.M)


def module_pointers() -> dict[str, str]:
    """{module path: the docs page its docstring sends the reader to for its design}."""
    import ast
    found = {}
    sources = [*REPO.glob("*.py"), *(f for top in sorted(TOP - {"tests", "profiles"})
                                     for f in (REPO / top).rglob("*.py"))]
    for path in sorted(sources):
        rel = path.relative_to(REPO).as_posix()
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        match = POINTER.search(" ".join(doc.split()))
        if match:
            found[rel] = match.group(1) or match.group(2)
    return found


def unmatched_designs(pointers: dict[str, str], pages: dict[str, str]) -> list[str]:
    """Each module that points to a section its page lacks, and each section of a page
    that no module points to it from (renamed, moved or its pointer dropped)."""
    sections = {(page, path) for page, text in pages.items() for path in SECTION.findall(text)}
    pointed = set((page, path) for path, page in pointers.items())
    return ([f"{path}: no section in {page}" for page, path in sorted(pointed - sections)]
            + [f"{page}: {path} does not point here" for page, path in sorted(sections - pointed)])


def test_every_moved_design_has_its_section_and_its_pointer():
    """A module's long design moved to docs/ stays reachable both ways: its docstring says
    where, and the page's section names the module."""
    pages = {f"docs/{p.name}": p.read_text() for p in (REPO / "docs").glob("*.md")}
    assert unmatched_designs(module_pointers(), pages) == []


def test_a_lost_design_is_found():
    pointers = {"a/one.py": "docs/design.md", "a/two.py": "docs/kernels.md"}
    pages = {"docs/design.md": "## `a/one.py`\n\n## `a/gone.py`\n", "docs/kernels.md": ""}
    assert unmatched_designs(pointers, pages) == [
        "a/two.py: no section in docs/kernels.md",
        "docs/design.md: a/gone.py does not point here"]


def test_the_design_pages_list_their_sections_in_path_order():
    """docs/design.md and docs/kernels.md hold a section per module, sorted by folder and
    then name, and open with a contents list of them all: a section appended out of place,
    or left out of the list, fails here."""
    for name in ("design.md", "kernels.md"):
        text = (REPO / "docs" / name).read_text()
        paths = SECTION.findall(text)
        assert paths == sorted(paths, key=lambda p: p.rpartition("/")[::2]), name
        contents = text.split("**Contents**", 1)[1].split("\n## ", 1)[0]
        assert re.findall(r"\(#([\w-]+)\)", contents) == [slug(f"`{p}`") for p in paths], name
