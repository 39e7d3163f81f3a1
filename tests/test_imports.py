"""The service's modules import each other without cycles (module-level imports)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "service"


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["service", *parts])


def _graph(lazy: bool = False) -> dict[str, set[str]]:
    """Module → the service's modules it imports (relative imports; ``lazy``: those inside
    functions too, else the module level only, where a cycle would break the import)."""
    mods = {_module(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree) if lazy else tree.body:  # module level: lazy imports are allowed
            if not lazy and isinstance(node, ast.If):  # TYPE_CHECKING blocks are not imports at run time
                continue
            if isinstance(node, ast.ImportFrom) and node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                names = [f"{target}.{a.name}" for a in node.names]
                for t in [target, *names]:
                    if t in graph and t != mod:
                        graph[mod].add(t)
    return graph


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert "service.engine" in graph and graph["service.engine"]  # the graph was read


def test_the_fold_and_the_scheduling_core_import_nothing_above_them():
    """The layer rule (``docs/ARCHITECTURE.md``), lazy imports included: ``scheduling/``
    imports only itself; ``log/`` (the fold, no I/O) only itself and ``scheduling/``;
    ``storage/`` knows of the fold only its events."""
    graph = _graph(lazy=True)
    allowed = {
        "service.scheduling": ("service.scheduling",),
        "service.log": ("service.log", "service.scheduling"),
    }
    wrong = {
        (m, t)
        for m, targets in graph.items()
        for layer, ok in allowed.items()
        if m == layer or m.startswith(layer + ".")
        for t in targets
        if not any(t == a or t.startswith(a + ".") for a in ok)
    }
    wrong |= {
        (m, t)
        for m, targets in graph.items()
        if m.startswith("service.storage")
        for t in targets
        if t.startswith("service.log") and t not in ("service.log", "service.log.events")
    }
    assert not wrong, sorted(wrong)
    assert graph["service.log.state"] >= {"service.log.events", "service.scheduling.strategies"}  # the graph was read
    assert "service.log.events" in graph["service.storage.repository"]


def test_one_service_module_per_resource_router():
    """``api/X.py`` ↔ ``service/X.py`` for the resources of the API."""
    for resource in ("runs", "prompts", "plans", "reports"):
        assert (ROOT / "api" / f"{resource}.py").is_file(), resource
        assert (ROOT / f"{resource}.py").is_file(), resource
        assert f"service.{resource}" in _graph()["service.engine"], resource


def test_no_service_module_imports_a_router():
    """Routers import services, never the other way: outside ``api/`` only the app
    factory (``app.py``, which mounts the routers) imports from it."""
    graph = _graph()
    wrong = {
        (m, t)
        for m, targets in graph.items()
        for t in targets
        if t.startswith("service.api") and not m.startswith("service.api") and m != "service.app"
    }
    assert not wrong, sorted(wrong)


def test_no_sql_outside_storage():
    """Every SQL statement lives in ``storage/``: outside it no module calls SQLAlchemy's
    ``select``/``text``/``insert``/``update``/``delete`` (imported from ``sqlalchemy``;
    ``np.insert`` is not SQL) nor a session's or connection's ``execute``/``scalar``/``scalars``."""
    found = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "storage":
            continue
        src = path.read_text()
        tree = ast.parse(src)
        names = {
            a.asname or a.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy")
            for a in node.names
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Name) and f.id in names and f.id in {"select", "text", "insert", "update", "delete"}:
                found.append(f"{rel}:{node.lineno} {f.id}(")
            if isinstance(f, ast.Attribute) and f.attr in {"execute", "scalar", "scalars"}:
                found.append(f"{rel}:{node.lineno} .{f.attr}(")
    assert not found, found


def test_a_checkout_folder_named_rollplan_does_not_shadow_the_package(tmp_path):
    """A script next to a checkout folder named ``rollplan`` imports the installed package
    (the checkout's root ``__init__.py`` hands the import over); without an installed
    package (``-S``: no site-packages) it gets an ImportError that names the folder."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "rollplan").symlink_to(root, target_is_directory=True)
    (tmp_path / "script.py").write_text(
        "from rollplan import Client\nimport rollplan.plugins.core\nprint(Client.__module__)\n"
    )
    ok = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "rollplan.client"
    bare = subprocess.run([sys.executable, "-S", "script.py"], cwd=tmp_path, capture_output=True, text=True)
    assert bare.returncode != 0
    assert "a Rollplan checkout, not to the installed package" in bare.stderr
    assert "unknown location" not in bare.stderr
