"""The layout's rules (docs/layout.md): imports run down the layers, never up, and no two
modules import each other, at any depth of a file (a lazy import inside a function
counts). The layers, lowest first; a folder may import itself and the layers below it."""

import ast
from pathlib import Path

from tests.helpers import REPO

# Each folder's rank: it may import itself and the folders of a lower rank. viewer and studies are
# the top: nothing imports them (bench and tests stand outside).
RANK = {"core": 0, "model": 1, "data": 1, "kernels": 2, "losses": 3, "training": 4,
        "profiling": 5, "train": 6, "viewer": 7, "studies": 7}
LAYERS = tuple(RANK)


def _layer(path: Path, root: Path) -> str | None:
    top = path.relative_to(root).parts
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
        own = _layer(path, root) if ".venv" not in path.parts else None
        if own is None:
            continue
        for line, name in _imports(path):
            if name in RANK and name != own and RANK[name] >= RANK[own]:
                found.append(f"{path.relative_to(root)}:{line} imports {name} ({own} is not "
                             "above it)")
    return found


def test_no_import_runs_up():
    assert breaches() == []


def test_a_lazy_import_up_is_found(tmp_path):
    """The check itself: training/job_notes.py imported profiling.run_folder inside a
    function, and nothing said so."""
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "notes.py").write_text(
        "def settle():\n    from profiling.run_folder import mark\n")
    assert breaches(tmp_path) == ["training/notes.py:2 imports profiling (training is not "
                                  "above it)"]


def _module(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph(root: Path) -> dict[str, set[str]]:
    """module -> the project's modules it imports, lazy ones too (`from a.b import c`
    imports a.b, and a.b.c where that is a module)."""
    paths = {_module(p, root): p for p in sorted(root.rglob("*.py"))
             if ".venv" not in p.parts and _layer(p, root)}
    graph = {}
    for name, path in paths.items():
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            graph[name].update(t for t in targets if t in paths and t != name)
    return graph


def circles(root: Path = REPO) -> list[list[str]]:
    """Every set of modules that import one another (Tarjan's strongly connected
    components of more than one module), each sorted."""
    graph, index, low, stack, found = _graph(root), {}, {}, [], []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_two_modules_import_each_other():
    assert circles() == []


def test_a_lazy_circle_is_found(tmp_path):
    """The check itself: kernels/trunk/first_block.py imported first_block_bwd lazily,
    which imported first_block at its top, and nothing said so."""
    trunk = tmp_path / "kernels" / "trunk"
    trunk.mkdir(parents=True)
    (trunk / "first_block.py").write_text(
        "def backward():\n    from kernels.trunk.first_block_bwd import code\n")
    (trunk / "first_block_bwd.py").write_text("from kernels.trunk import first_block\n")
    (trunk / "walk.py").write_text("import kernels.trunk.first_block\n")
    assert circles(tmp_path) == [["kernels.trunk.first_block",
                                  "kernels.trunk.first_block_bwd"]]
