"""The layout's rules, checked: pyspark only in the binding, no private names across packages.

docs/architecture.md draws the layout; these tests keep the code to it.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import twophase

PACKAGE = Path(twophase.__file__).resolve().parent
SPARK_FREE_EXCEPTIONS = {"twophase.cli.demo", "twophase.__main__"}
"""Entry points that start or drive Spark on purpose."""


def _modules() -> list[str]:
    return sorted(
        m.name for m in pkgutil.walk_packages([str(PACKAGE)], prefix="twophase.") if not m.ispkg
    )


def _sourceOf(module: str) -> Path:
    path = PACKAGE.joinpath(*module.split(".")[1:])
    return path.with_suffix(".py") if path.with_suffix(".py").exists() else path / "__init__.py"


def _imports(module: str) -> list[tuple[str, list[str]]]:
    tree = ast.parse(_sourceOf(module).read_text())
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def _systemModules() -> list[str]:
    return [
        m
        for m in _modules()
        if not m.startswith("twophase.spark.") and m not in SPARK_FREE_EXCEPTIONS
    ]


def test_only_the_spark_binding_imports_pyspark() -> None:
    offenders = [
        f"{m} imports {name}"
        for m in _systemModules()
        for name, _ in _imports(m)
        if name == "pyspark" or name.startswith("pyspark.")
    ]
    assert not offenders, offenders


def test_system_code_imports_without_pyspark_installed() -> None:
    modules = _systemModules()
    code = (
        "import sys\n"
        "sys.modules['pyspark'] = None  # any import of pyspark now fails\n"
        f"for name in {modules!r}:\n"
        "    __import__(name)\n"
        "print('imported', len(sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]


def test_no_module_imports_a_private_name_of_another_package() -> None:
    offenders = []
    for module in _modules():
        package = module.rsplit(".", 1)[0]
        for name, names in _imports(module):
            if not name.startswith("twophase."):
                continue
            target = (
                name
                if (PACKAGE / "/".join(name.split(".")[1:])).is_dir()
                else (name.rsplit(".", 1)[0])
            )
            privateModule = any(part.startswith("_") for part in name.split(".")[1:])
            privateNames = [n for n in names if n.startswith("_") and n != "__version__"]
            if target != package and (privateModule or privateNames):
                offenders.append(f"{module}: from {name} import {', '.join(names)}")
    assert not offenders, offenders


def test_every_module_says_its_role_in_a_first_docstring_line() -> None:
    missing = []
    for module in _modules():
        doc = ast.get_docstring(ast.parse(_sourceOf(module).read_text()))
        if module.endswith("__main__"):
            continue
        if not doc or not doc.splitlines()[0].strip():
            missing.append(module)
    assert not missing, missing


def test_sinks_and_sources_do_not_import_each_other() -> None:
    offenders = [
        f"{m} imports {name}"
        for m in _modules()
        for name, _ in _imports(m)
        if (m.startswith("twophase.sinks.") and name.startswith("twophase.sources"))
        or (m.startswith("twophase.sources.") and name.startswith("twophase.sinks"))
    ]
    assert not offenders, offenders


def _isCommandLine(module: str) -> bool:
    return module == "twophase.cli" or module.startswith("twophase.cli.")


def test_the_command_line_is_the_top_floor_and_has_no_import_loop() -> None:
    """Nothing below ``twophase.cli`` imports it (``twophase.__main__`` only runs it), and no
    module of the command line imports one that imports it back, even inside a function."""
    pkgs = pkgutil.walk_packages([str(PACKAGE)], prefix="twophase.")
    modules = {"twophase", *(m.name for m in pkgs)}
    edges: dict[str, set[str]] = {}
    for module in modules:
        imported = _imports(module)
        named = {name for name, _ in imported}
        named |= {f"{name}.{n}" for name, names in imported for n in names}
        edges[module] = {n for n in named if n in modules and _isCommandLine(n)}
    below = [
        f"{module} imports {', '.join(sorted(targets))}"
        for module, targets in sorted(edges.items())
        if targets and not _isCommandLine(module) and module != "twophase.__main__"
    ]
    assert not below, below

    def loopFrom(path: list[str]) -> list[str] | None:
        for target in sorted(edges[path[-1]]):
            if target == path[0]:
                return [*path, target]
            if target not in path and (found := loopFrom([*path, target])):
                return found
        return None

    loops = [loop for m in sorted(modules) if _isCommandLine(m) and (loop := loopFrom([m]))]
    assert not loops, loops


def test_no_import_loop_and_nothing_imports_the_package_back() -> None:
    """Imports go one way, from the command line down to the protocol: no two modules of
    ``twophase`` reach each other through imports (at module level or inside a function), and
    only the top floor (the command line, ``__main__``) imports the ``twophase`` package itself,
    whose ``__init__`` sits above the Spark binding."""
    modules = {"twophase", *_modules()}
    modules |= {m.name for m in pkgutil.walk_packages([str(PACKAGE)], prefix="twophase.")}
    edges: dict[str, set[str]] = {}
    for module in modules:
        targets: set[str] = set()
        for name, names in _imports(module):
            found = {f"{name}.{n}" for n in names} & modules
            targets |= found or ({name} & modules)
        edges[module] = targets - {module}
    backUp = sorted(
        m
        for m, targets in edges.items()
        if "twophase" in targets and not (_isCommandLine(m) or m == "twophase.__main__")
    )
    assert not backUp, f"import the twophase package from below it: {backUp}"

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    assert not loops, loops
