"""The layout's rule (docs/layout.md): imports run down the layers, never up, at any depth
of a file (a lazy import inside a function counts). The layers, lowest first; a folder may
import itself and the layers below it."""

import ast
from pathlib import Path

from tests.helpers import REPO

# Each folder's rank: it may import itself and the folders of a lower rank. viewer and studies are
# the top: nothing imports them (bench and tests stand outside).
RANK = {"core": 0, "model": 1, "data": 1, "kernels": 2, "losses": 3, "training": 4,
        "profiling": 5, "train": 6, "viewer": 7, "studies": 7}
LAYERS = tuple(RANK)


def _layer(path: Path) -> str | None:
    top = path.relative_to(REPO).parts
    name = top[0] if len(top) > 1 else path.stem
    return name if name in LAYERS else None


def _imports(path: Path):
    """(line, the top-level name) of every absolute import in the file, lazy ones too."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module.split(".")[0]


def breaches(root: Path = REPO) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        own = _layer(path) if ".venv" not in path.parts else None
        if own is None:
            continue
        for line, name in _imports(path):
            if name in RANK and name != own and RANK[name] >= RANK[own]:
                found.append(f"{path.relative_to(root)}:{line} imports {name} ({own} is not "
                             "above it)")
    return found


def test_no_import_runs_up():
    assert breaches() == []


def test_a_lazy_import_up_is_found(tmp_path, monkeypatch):
    """The check itself: training/job_notes.py imported profiling.run_folder inside a
    function, and nothing said so."""
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "notes.py").write_text(
        "def settle():\n    from profiling.run_folder import mark\n")
    monkeypatch.setattr("tests.test_layout.REPO", tmp_path)
    assert breaches(tmp_path) == ["training/notes.py:2 imports profiling (training is not "
                                  "above it)"]
