"""The layout stays readable (issue #23): imports flow one way with no circle, the backends never reach up
into the API, commands or serving, and no module or function grows past what a newcomer reads in one go."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "prefill"
MAX_MODULE_LINES = 420
MAX_FUNCTION_LINES = 60


def modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def module_imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's module-level imports of other prefill modules (imports inside functions are deferred
    on purpose and do not count)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        package = m.split(".") if path.name == "__init__.py" else m.split(".")[:-1]
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
            if not target or not target.startswith("prefill"):
                continue
            subs = {f"{target}.{a.name}" for a in node.names} & set(mods)
            if len(subs) < len(node.names) and target in mods:
                subs.add(target)
            graph[m] |= subs - {m}
    return graph


def test_no_import_circle():
    graph = module_imports(modules())
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in graph[m]:
            assert state.get(n) != 1, f"import circle: {' -> '.join(path[path.index(n) :] + [n])}"
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [m])


def test_backends_do_not_import_upwards():
    up = ("prefill.api", "prefill.commands", "prefill.cli", "prefill.serving", "prefill.bench")
    for m, deps in module_imports(modules()).items():
        if m.startswith("prefill.backends"):
            assert not [d for d in deps if d.startswith(up)], (m, deps)


def test_no_module_or_function_too_long_to_read():
    for name, path in modules().items():
        source = path.read_text()
        assert source.count("\n") <= MAX_MODULE_LINES, f"{name}: {source.count(chr(10))} lines"
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= MAX_FUNCTION_LINES, f"{name}.{node.name}: {length} lines"
