"""The floors as a contract: import-linter's contracts (pyproject.toml) hold, no import cycle exists between any
two modules, no module imports another module's private names, and the read-only commands stay light."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest
from conftest import BIN, ROOT
from helpers import method_calls, method_calls_in_flows

PACKAGES = ("storage", "policy", "tasks", "trainers", "flows", "bench")


def test_import_contracts_hold():
    """`lint-imports` exits 0: every floor, independence and forbidden contract in pyproject.toml is kept."""
    result = subprocess.run(
        [str(BIN / "lint-imports"), "--no-logo", "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
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
                    found += [
                        f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{alias.name}"
                        for alias in node.names
                        if alias.name.startswith("_") and not alias.name.startswith("__")
                    ]
    return found


def test_no_module_imports_private_names():
    assert private_imports() == []


@pytest.mark.parametrize("arguments", [["--help"], ["sql", "select 1 as one"]])
def test_read_only_commands_import_neither_torch_nor_trl(arguments, tmp_path):
    """`rlvr --help` and `rlvr sql` start without torch, TRL or Prefect: the benchmarks and the model code are
    imported only by the commands that run them."""
    script = (
        "import sys\nfrom flows.cli.main import app\n"
        f"try:\n    app({arguments!r}, prog_name='rlvr')\nexcept SystemExit as stop:\n    code = stop.code\n"
        "heavy = sorted(m for m in ('torch', 'trl', 'transformers', 'prefect', 'bench.peer') if m in sys.modules)\n"
        "print('HEAVY', ','.join(heavy)); sys.exit(code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "RLVR_LAKE": str(tmp_path / "lake")},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "HEAVY \n" in result.stdout or result.stdout.rstrip().endswith("HEAVY"), result.stdout[-500:]


def test_every_package_says_what_it_holds_and_may_import():
    """Each package's opening docstring names what the package holds and, in a `May import:` line, its floors."""
    missing = []
    for package in PACKAGES:
        for init in sorted((ROOT / package).rglob("__init__.py")):
            if "problems" in init.parts:  # shipped problem files, not code
                continue
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            if "May import:" not in doc or len(doc.split("May import:")[0].strip()) < 20:
                missing.append(str(init.relative_to(ROOT)))
    assert missing == []


def function_level_imports(packages=("storage", "policy", "tasks", "trainers")) -> list[str]:
    """Project imports inside a function, each as 'file:line module' and the line's own text: a lazy import
    hides an arrow from a reader of the module's head, so each must say why (`# lazy: <reason>`)."""
    found = []
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            lines = path.read_text().splitlines()
            for node in ast.walk(ast.parse("\n".join(lines))):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for inner in ast.walk(node):
                    module = (
                        inner.module
                        if isinstance(inner, ast.ImportFrom) and inner.level == 0
                        else inner.names[0].name
                        if isinstance(inner, ast.Import)
                        else None
                    )
                    if module and module.split(".")[0] in PACKAGES:
                        found.append(f"{path.relative_to(ROOT)}:{inner.lineno} {module}  {lines[inner.lineno - 1]}")
    return sorted(set(found))


def test_function_level_imports_are_few_and_say_why():
    """At most 10 project imports inside functions below the flows (73 before the policy floor), each with a
    `# lazy:` reason on its line (an optional heavy dependency)."""
    found = function_level_imports()
    assert len(found) <= 10, "\n".join(found)
    assert [line for line in found if "# lazy:" not in line] == []


def test_the_import_counter_sees_an_import_inside_a_function(tmp_path, monkeypatch):
    """The count above can fail: an import inside a function body is found, one at the top is not."""
    package = tmp_path / "tasks"
    package.mkdir()
    (package / "module.py").write_text("from storage import lake\n\ndef f():\n    from storage import runs\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert [line.split("  ")[0] for line in function_level_imports(("tasks",))] == ["tasks/module.py:4 storage"]


def source_lengths() -> dict[str, int]:
    """Every Python file of the packages, the tests and infra/, by its lines (the shipped problems are data)."""
    folders = (*PACKAGES, "tests", "infra")
    paths = [path for folder in folders for path in (ROOT / folder).rglob("*.py") if "problems" not in path.parts]
    return {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in paths}


def test_no_source_file_is_longer_than_one_sitting():
    """No module over 450 lines anywhere (tests and infra/ too), none over 400 in `storage/` (the lake's rooms)."""
    lengths = source_lengths()
    assert {name: n for name, n in lengths.items() if n > 450} == {}
    assert {name: n for name, n in lengths.items() if name.startswith("storage/") and n > 400} == {}


def declared_imports(docstring: str) -> set[str]:
    """The project packages a `May import:` line names (the ones after `never` are refused, not allowed)."""
    allowed = docstring.split("May import:", 1)[1].split("never", 1)[0]
    allowed = re.sub(r"\bno\s+`?[a-z_.]+", "", allowed)  # "no storage: a verifier is pure"
    pattern = r"\b(?:" + "|".join(PACKAGES) + r")(?:\.[a-z_]+)*"
    return set(re.findall(pattern, allowed))


def undeclared_imports(graph, package: str, declared: set[str]) -> list[str]:
    """The modules outside `package` that it imports (tasks' packages by their second level, the other floors
    by their first) which its `May import:` line does not name."""
    found = set()
    for module in graph.find_children(package) | {package} | graph.find_descendants(package):
        for imported in graph.find_modules_directly_imported_by(module):
            top = imported.split(".")[0]
            if top not in PACKAGES or imported == package or imported.startswith(package + "."):
                continue
            found.add(".".join(imported.split(".")[:2]) if top == "tasks" else top)
    return sorted(
        name
        for name in found
        if not any(name == d or name.startswith(d + ".") or d.startswith(name + ".") for d in declared)
    )


def test_every_package_imports_only_what_its_docstring_says():
    """A `May import:` line is kept true: each package imports no project package its line leaves out."""
    graph = module_graph()
    wrong = {}
    for package in PACKAGES:
        for init in sorted((ROOT / package).rglob("__init__.py")):
            if "problems" in init.parts:
                continue
            name = ".".join(init.parent.relative_to(ROOT).parts)
            missing = undeclared_imports(graph, name, declared_imports(ast.get_docstring(ast.parse(init.read_text()))))
            if missing:
                wrong[name] = missing
    assert wrong == {}


def test_flows_call_steps_not_each_others_bodies():
    """A flow validates its JSON parameters and calls its step; within a process the loop and its roles call the
    steps with typed configs and an open lake, never a flow's `.fn` with a config dumped back to JSON."""
    assert method_calls_in_flows({"fn"}) == {}
    assert method_calls("rl_iteration.fn(config, 1, uri)\n", {"fn"}) == [1]
