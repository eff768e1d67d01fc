"""Process B of a workspace run: the problem's unittest modules, run one test at a time against the
candidate's modules in process A (through `remote`), each result reported as it is known.

The tests' count is taken from their source before anything of the candidate's runs, so a candidate
that kills its process, or makes the tests' imports fail, loses every test it did not pass. Each
test has its own deadline; once a call times out the candidate may still be busy, and the tests
after it fail at once. Test modules are compiled from memory: they are never on any disk the
candidate can see.
"""

from __future__ import annotations

import ast
import sys
import time
import types
import unittest

from tasks.sandbox.protocol import send_value
from tasks.sandbox.proxies import Connection, RemoteImporter
from tasks.sandbox.remote import candidate_roots, forget_modules


def declared_tests(name: str, source: str) -> list[str]:
    """`file::Class.method` for each `test*` method of each class in a test module, in source order."""
    module = ast.parse(source)
    stem = name[:-3] if name.endswith(".py") else name
    found = []
    for node in module.body:
        if isinstance(node, ast.ClassDef):
            found += [
                f"{stem}::{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test")
            ]
    return found


def module_name(path: str) -> str:
    return path[:-3].replace("/", ".") if path.endswith(".py") else path


def run_suite(
    tests: dict[str, str],
    workspace_files: list[str],
    request_fd: int,
    response_fd: int,
    result_fd: int,
    test_seconds: float | None = None,
    stop_after_failure: bool = False,
    only: list[str] | None = None,
) -> None:
    """Report ("total", n), then ("result", i, passed, message, test name, seconds) per test, then ("done",).
    `only`: the test files to run (default every one)."""
    files = [name for name in sorted(tests) if name.endswith(".py") and (only is None or name in only)]
    declared = {name: declared_tests(name, tests[name]) for name in files}
    names = [test for name in files for test in declared[name]]
    send_value(result_fd, ("total", max(1, len(names))))
    connection = Connection(request_fd, response_fd)
    roots = candidate_roots(workspace_files)
    forget_modules(roots)
    sys.meta_path.insert(0, RemoteImporter(connection, roots))
    for name, source in tests.items():  # helpers the tests import from each other
        if name.endswith(".py") and name not in files:
            _load(name, source, connection, test_seconds)
    index, stopped = 0, None
    for name in files:
        module, error = _load(name, tests[name], connection, test_seconds)
        for test_name in declared[name]:
            started = time.perf_counter()
            message = stopped or error or _run_one(module, test_name, connection, test_seconds)
            seconds = round(time.perf_counter() - started, 6)
            send_value(result_fd, ("result", index, message is None, message or "", test_name, seconds))
            index += 1
            if stopped is None and connection.busy:
                stopped = "not run: the candidate is still busy with an earlier test"
            elif stopped is None and message is not None and stop_after_failure:
                stopped = "not run: an earlier test failed"
    if not names:
        send_value(result_fd, ("result", 0, False, "the tests define no test methods", "-"))
    send_value(result_fd, ("done",))
    while True:  # hold the candidate's pipe open until the server has counted what it left running:
        time.sleep(60)  # once this process exits, the candidate's ends, and with it its PID namespace


def _load(
    name: str, source: str, connection: Connection, test_seconds: float | None
) -> tuple[types.ModuleType | None, str | None]:
    """A test module, executed (its imports of the candidate's modules within one test's deadline)."""
    module = types.ModuleType(module_name(name))
    module.__file__ = f"<tests>/{name}"
    sys.modules[module.__name__] = module
    connection.deadline = None if test_seconds is None else time.monotonic() + test_seconds
    try:
        exec(compile(source, module.__file__, "exec"), module.__dict__)
    except BaseException as error:  # noqa: BLE001 - a test module that cannot load fails its tests
        return None, f"the tests could not load: {type(error).__name__}: {error}"[:300]
    finally:
        connection.deadline = None
    return module, None


def _run_one(
    module: types.ModuleType, test_name: str, connection: Connection, test_seconds: float | None
) -> str | None:
    """None if the test passed, else why not (the first failure or error, shortened)."""
    class_name, method = test_name.split("::")[1].split(".")
    case_class = getattr(module, class_name, None)
    if not (isinstance(case_class, type) and issubclass(case_class, unittest.TestCase)):
        return f"{class_name} is not a unittest.TestCase"
    result = unittest.TestResult()
    connection.deadline = None if test_seconds is None else time.monotonic() + test_seconds
    try:
        case_class(method).run(result)
    finally:
        connection.deadline = None
    problems = result.errors + result.failures
    if problems:
        return _last_line(problems[0][1])
    if result.skipped:
        return f"skipped: {result.skipped[0][1]}"[:300]
    if result.expectedFailures or result.unexpectedSuccesses or result.testsRun != 1:
        return "did not run as a plain test"
    return None


def _last_line(trace: str) -> str:
    lines = [line for line in trace.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "failed")[:300]
