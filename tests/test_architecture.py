"""The floors as a contract: import-linter's contracts (pyproject.toml) hold, no import cycle exists between any
two modules, no module imports another module's private names, and the read-only commands stay light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BIN, ROOT

PACKAGES = ("storage", "policy", "tasks", "trainers", "flows", "bench")


def test_import_contracts_hold():
    """`lint-imports` exits 0: every floor, independence and forbidden contract in pyproject.toml is kept."""
    result = subprocess.run([str(BIN / "lint-imports"), "--no-logo", "--no-cache"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "broken" not in result.stdout.lower().replace("0 broken", "")


def module_graph():
    import grimp

    return grimp.build_graph(*PACKAGES, cache_dir=None)


def import_cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    modules = sorted(graph.modules)
    index, low, on_stack, stack, cycles, counter = {}, {}, set(), [], [], [0]

    def connect(root: str) -> None:
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))

    for module in modules:
        if module not in index:
            connect(module)
    return cycles


def test_no_module_imports_itself_back():
    """No cycle of imports between modules anywhere (module-level and function-level imports alike)."""
    graph = module_graph()
    # the graph's internal modules only: an external package is a leaf
    assert import_cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    """The check above can fail: two modules importing each other are one component."""
    import grimp

    graph = grimp.ImportGraph()
    for name in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(name)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.a")
    graph.add_import(importer="pkg.c", imported="pkg.a")
    assert import_cycles(graph) == [["pkg.a", "pkg.b"]]


def private_imports() -> list[str]:
    """`from other.module import _name` anywhere in the packages: each as 'file:line module._name'."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                    found += [f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{alias.name}" for alias in
                              node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_module_imports_private_names():
    assert private_imports() == []


@pytest.mark.parametrize("arguments", [["--help"], ["sql", "select 1 as one"]])
def test_read_only_commands_import_neither_torch_nor_trl(arguments, tmp_path):
    """`rlvr --help` and `rlvr sql` start without torch, TRL or Prefect: the benchmarks and the model code are
    imported only by the commands that run them."""
    script = ("import sys\nfrom flows.cli.main import app\n"
              f"try:\n    app({arguments!r}, prog_name='rlvr')\nexcept SystemExit as stop:\n    code = stop.code\n"
              "heavy = sorted(m for m in ('torch', 'trl', 'transformers', 'prefect', 'bench.peer') if m in sys.modules)\n"
              "print('HEAVY', ','.join(heavy)); sys.exit(code)\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**__import__("os").environ, "RLVR_LAKE": str(tmp_path / "lake")})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "HEAVY \n" in result.stdout or result.stdout.rstrip().endswith("HEAVY"), result.stdout[-500:]


def test_every_package_says_what_it_holds_and_may_import():
    """Each package's opening docstring names what the package holds and, in a `May import:` line, its floors."""
    missing = []
    for package in PACKAGES:
        for init in sorted((ROOT / package).rglob("__init__.py")):
            if "problems" in init.parts:                     # shipped problem files, not code
                continue
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            if "May import:" not in doc or len(doc.split("May import:")[0].strip()) < 20:
                missing.append(str(init.relative_to(ROOT)))
    assert missing == []
