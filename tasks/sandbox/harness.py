"""What runs inside the two sandboxed processes of a code test.

The candidate program and the tests never share a process. Process A executes the candidate
and answers calls; process B (another user id) executes the problem's prompt (for its helper
functions) and the tests, calling the candidate through a proxy. Values cross the pipe with
`marshal`, which accepts builtin types only: an object whose `__eq__` always says yes cannot
cross. Assertions are evaluated in B, so exiting early, printing "passed", patching builtins or
catching `AssertionError` in A changes nothing; A never sees the tests, on disk or in memory.

Each test case has its own deadline (`test_seconds`, the candidate's load included in the first):
past it the case fails, and since A is still busy with it, the rest fail at once without waiting —
a program that loops forever costs one deadline, not one per test. With `stop_after_failure` (an
all-or-nothing reward), the first failing case ends the run the same way.
"""

from __future__ import annotations

import ast
import marshal
import select
import sys

from tasks.sandbox.protocol import recv_bytes, recv_value, send_bytes, send_value


def serve_candidate(program: str, request_fd: int, response_fd: int) -> None:
    """Process A: run the candidate, then answer (name, args, kwargs) calls until the pipe closes."""
    namespace: dict = {"__name__": "__candidate__"}
    load_error = None
    try:
        exec(compile(program, "<candidate>", "exec"), namespace)
    except BaseException as error:  # noqa: BLE001 - anything the candidate raises is its failure
        load_error = f"{type(error).__name__}: {error}"[:500]
    while True:
        payload = recv_bytes(request_fd)
        if payload is None:
            return
        name, args, kwargs = marshal.loads(payload)
        if load_error is not None:
            reply = ("error", "load", load_error)
        else:
            try:
                reply = ("ok", namespace[name](*args, **kwargs))
            except BaseException as error:  # noqa: BLE001
                reply = ("error", type(error).__name__, str(error)[:300])
        try:
            encoded = marshal.dumps(reply)
        except (ValueError, TypeError):
            encoded = marshal.dumps(("error", "unmarshallable", "the result is not made of builtin types"))
        send_bytes(response_fd, encoded)


class CandidateFailure(Exception):
    """The candidate raised, returned something that is not plain data, or died."""


class CandidateTimeout(CandidateFailure):
    """The candidate did not answer within the test case's deadline; it may still be computing."""


def make_proxy(entry_point: str, request_fd: int, response_fd: int, test_seconds: float | None = None):
    """The candidate as the tests see it: a function whose calls cross the pipe. After a call that timed
    out, A is still busy with it (its late answer must not be taken for another call's), so every later
    call fails at once; `candidate.busy` says so."""
    waiting = select.poll()
    waiting.register(response_fd, select.POLLIN | select.POLLHUP | select.POLLERR)

    def candidate(*args, **kwargs):
        if candidate.busy:
            raise CandidateTimeout("not run: the candidate is still busy with an earlier test")
        try:
            send_bytes(request_fd, marshal.dumps((entry_point, args, kwargs)))
        except ValueError as error:
            raise CandidateFailure(f"test arguments are not plain data: {error}") from None
        except OSError:
            raise CandidateFailure("the candidate process is gone") from None
        if test_seconds is not None and not waiting.poll(int(test_seconds * 1000)):
            candidate.busy = True
            raise CandidateTimeout(f"timed out after {test_seconds:g} s")
        try:
            reply = recv_value(response_fd)
        except (EOFError, ValueError, OSError):
            raise CandidateFailure("the candidate process exited or sent garbage") from None
        if not isinstance(reply, tuple) or not reply or reply[0] not in ("ok", "error"):
            raise CandidateFailure("malformed reply")
        if reply[0] == "ok" and len(reply) == 2:
            return reply[1]
        raise CandidateFailure(": ".join(map(str, reply[1:])))

    candidate.__name__ = entry_point
    candidate.busy = False
    return candidate


def test_units(tests: str, entry_point: str) -> tuple[list[ast.stmt], list[ast.stmt]]:
    """(setup, units): module statements to run first, then the statements each counted as a test.

    With a `check(candidate)` function (HumanEval), every statement of its body that asserts,
    raises or calls the candidate is one test; otherwise the module's own such statements are.
    """
    module = ast.parse(tests)
    check = next((node for node in module.body if isinstance(node, ast.FunctionDef) and node.name == "check"), None)
    calls_check = any(
        isinstance(node, ast.Call) and getattr(node.func, "id", None) == "check" for node in ast.walk(module)
    )
    names = {"candidate", entry_point}
    if check is not None and not calls_check:
        return module.body, check.body
    return [s for s in module.body if not _is_test(s, names)], [s for s in module.body if _is_test(s, names)]


def _is_test(statement: ast.stmt, names: set[str]) -> bool:
    return any(
        isinstance(node, (ast.Assert, ast.Raise)) or (isinstance(node, ast.Name) and node.id in names)
        for node in ast.walk(statement)
    )


def run_tests(
    prompt: str,
    tests: str,
    entry_point: str,
    request_fd: int,
    response_fd: int,
    result_fd: int,
    test_seconds: float | None = None,
    stop_after_failure: bool = False,
) -> None:
    """Process B: report ("total", n), then ("result", i, passed, message) per test, then ("done",)."""
    namespace: dict = {"__name__": "__tests__"}
    try:
        exec(compile(prompt, "<prompt>", "exec"), namespace)  # helper functions the tests use
    except BaseException:  # noqa: BLE001 - a stub that does not run is not the tests' concern
        pass
    proxy = make_proxy(entry_point, request_fd, response_fd, test_seconds)
    namespace[entry_point] = proxy
    namespace["candidate"] = proxy
    try:
        setup, units = test_units(tests, entry_point)
    except SyntaxError as error:
        send_value(result_fd, ("total", 1))
        send_value(result_fd, ("result", 0, False, f"tests do not parse: {error}"))
        send_value(result_fd, ("done",))
        return
    send_value(result_fd, ("total", max(1, len(units))))
    setup_error = _run(setup, namespace)
    namespace[entry_point] = namespace["candidate"] = proxy  # the tests' module may have rebound them
    stopped = None
    for index, unit in enumerate(units):
        error = stopped or setup_error or _run([unit], namespace)
        send_value(result_fd, ("result", index, error is None, error or ""))
        if stopped is None and proxy.busy:
            stopped = "not run: the candidate is still busy with an earlier test"
        elif stopped is None and error is not None and stop_after_failure:
            stopped = "not run: an earlier test failed"
    if not units:
        send_value(result_fd, ("result", 0, setup_error is None, setup_error or ""))
    send_value(result_fd, ("done",))


def _run(statements: list[ast.stmt], namespace: dict) -> str | None:
    if not statements:
        return None
    try:
        code = compile(ast.Module(body=statements, type_ignores=[]), "<tests>", "exec")
        exec(code, namespace)
    except BaseException as error:  # noqa: BLE001
        return f"{type(error).__name__}: {error}"[:300]
    return None


def run_script(program: str) -> None:
    """A plain run of a program as `__main__` (for `script` jobs)."""
    namespace = {"__name__": "__main__"}
    exec(compile(program, "<program>", "exec"), namespace)
    sys.stdout.flush()
