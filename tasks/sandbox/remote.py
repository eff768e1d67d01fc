"""Objects across the sandbox's process boundary: the candidate's workspace in process A, the tests in B.

File- and project-level tests construct the candidate's classes and call their methods, so a
function proxy is not enough — but the tests must still never share a process with the candidate
(a candidate in the tests' process could patch `unittest`, rebind the tests' names, or return an
object whose `__eq__` always says yes). So B sees A's modules, classes and objects as *handles*:

- Plain data (None, bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)
  crosses by value, copied to its exact builtin type in A with the builtin's own methods
  (`int.__index__`, `str.__str__`, `list.copy` …), so a subclass's overrides never reach B.
- Anything else stays in A and crosses as a handle; B's `Remote` forwards attribute access, calls,
  `len`, `iter`/`next`, `in`, `[]`, `with`, `bool`, `str`. A `Remote` equals only itself, and the
  `with` block of a candidate object never swallows the tests' exceptions.
- Exceptions cross as their builtin type; a class the candidate defines arrives as a stand-in
  subclass of its nearest builtin base, one per class, so `assertRaises(module.Error)` works.
  SystemExit, KeyboardInterrupt and other non-`Exception`s arrive as `CandidateFailure`.
- Calls are served concurrently in A (one thread per call in flight), so thread-safety tests in B
  exercise the candidate's own locking.

Messages are `marshal`ed tagged trees; B checks every reply's shape and types, since A may write
anything to its pipe.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import marshal
import os
import queue
import sys
import threading
import types

from tasks.sandbox.protocol import recv_bytes, send_bytes

SCALARS = (type(None), bool, int, float, complex, str, bytes)
CONTAINERS = (list, tuple, dict, set, frozenset)
TAGS = {list: "l", tuple: "t", set: "s", frozenset: "f"}  # sequences and sets in a tagged tree (dicts: "d")
KINDS = {tag: kind for kind, tag in TAGS.items()}
MAX_THREADS = 64


class CandidateFailure(Exception):
    """The candidate raised something that is not an `Exception`, died, or sent garbage."""


class CandidateTimeout(CandidateFailure):
    """No answer within the test's deadline; the candidate may still be computing."""


def is_plain(value, depth: int = 0) -> bool:
    """Exact builtin data all the way down (no subclasses, no code objects)."""
    kind = type(value)
    if kind in SCALARS:
        return True
    if depth > 100 or kind not in CONTAINERS:
        return False
    if kind is dict:
        return all(is_plain(k, depth + 1) and is_plain(v, depth + 1) for k, v in value.items())
    return all(is_plain(item, depth + 1) for item in value)


# ---- process A: the candidate's side ----------------------------------------------------------
class Workspace:
    """Serves B's requests against the candidate's modules, each call in a thread of its own."""

    def __init__(self, request_fd: int, response_fd: int):
        self.request_fd, self.response_fd = request_fd, response_fd
        self.objects: dict[int, object] = {}
        self.handles: dict[int, int] = {}  # id(object) -> handle
        self.methods: dict[type, list[str]] = {}
        self.lock = threading.Lock()  # the handle table and the response pipe
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.idle = 0
        self.threads = 0

    def serve(self) -> None:
        while True:
            payload = recv_bytes(self.request_fd)
            if payload is None:
                return
            if not self._dispatch(payload):
                self._answer(payload)  # no thread at all could start: answer it here

    def _dispatch(self, payload: bytes) -> bool:
        """Hand a call to an idle thread or a new one; False when there is none and none can start (the user
        id's process limit counts threads, and other runs under that id may hold them all)."""
        with self.lock:
            if self.idle == 0 and self.threads < MAX_THREADS:
                try:
                    threading.Thread(target=self._work, daemon=True).start()
                    self.threads += 1
                except RuntimeError:  # "can't start new thread"
                    if self.threads == 0:
                        return False
                    self.idle -= 1  # it waits for one of the threads there are
            else:
                self.idle -= 1
        self.jobs.put(payload)
        return True

    def _work(self) -> None:
        while True:
            self._answer(self.jobs.get())
            with self.lock:
                self.idle += 1

    def _answer(self, payload: bytes) -> None:
        call_id, op, arguments = marshal.loads(payload)
        try:
            reply = ("ok", self._encode(self._perform(op, arguments)))
        except BaseException as error:  # noqa: BLE001 - the candidate's exception is its answer
            reply = self._raised(error)
        try:
            encoded = marshal.dumps((call_id, reply))
        except (ValueError, TypeError, RecursionError):
            encoded = marshal.dumps((call_id, ("fail", "the answer could not be encoded")))
        with self.lock:
            send_bytes(self.response_fd, encoded)

    def _perform(self, op: str, arguments: tuple):
        if op == "import":
            return importlib.import_module(arguments[0])
        target = self.objects[arguments[0]]
        rest = [self._decode(a) for a in arguments[1:]]
        if op == "getattr":
            return getattr(target, rest[0])
        if op == "setattr":
            return setattr(target, rest[0], rest[1])
        if op == "call":
            return target(*rest[0], **rest[1])
        if op == "method":
            return getattr(target, rest[0])(*rest[1], **rest[2])
        if op == "len":
            return len(target)
        if op == "iter":
            return iter(target)
        if op == "next":
            return next(target)
        if op == "contains":
            return rest[0] in target
        if op == "getitem":
            return target[rest[0]]
        if op == "setitem":
            target[rest[0]] = rest[1]
            return None
        if op == "delitem":
            del target[rest[0]]
            return None
        if op == "bool":
            return bool(target)
        if op in ("str", "repr"):
            return str(target) if op == "str" else repr(target)
        if op == "enter":
            return target.__enter__()
        if op == "exit":
            return bool(target.__exit__(None, None, None))
        raise CandidateFailure(f"unknown operation {op!r}")

    def _encode(self, value, depth: int = 0):
        """("v", plain) or ("h", handle, kind, name, methods[, builtin bases]) or tagged containers."""
        plain = _exact(value)
        if plain is _NOT_PLAIN:
            return self._handle(value)
        kind = type(plain)
        if kind in SCALARS or (depth == 0 and is_plain(plain)):
            return ("v", plain)
        if depth >= 50:
            return self._handle(value)
        if kind is dict:
            return ("d", [(self._encode(k, depth + 1), self._encode(v, depth + 1)) for k, v in plain.items()])
        return (TAGS[kind], [self._encode(item, depth + 1) for item in plain])

    def _handle(self, value) -> tuple:
        with self.lock:
            handle = self.handles.get(id(value))
            if handle is None:
                handle = len(self.objects) + 1
                self.objects[handle] = value
                self.handles[id(value)] = handle
        if isinstance(value, type) and issubclass(value, BaseException):
            return ("h", handle, "exception_class", value.__name__, [], _builtin_bases(value))
        if isinstance(value, (types.ModuleType, type)):
            kind = "module" if isinstance(value, types.ModuleType) else "class"
            return ("h", handle, kind, str(getattr(value, "__name__", "?")), [])
        return ("h", handle, "object", type(value).__name__, self._method_names(type(value)))

    def _method_names(self, kind: type) -> list[str]:
        """Names B may call without fetching the attribute first (functions on the class, not properties)."""
        names = self.methods.get(kind)
        if names is None:
            names = []
            for name in dir(kind):
                attribute = getattr(kind, name, None)
                if not name.startswith("__") and isinstance(
                    attribute,
                    (
                        types.FunctionType,
                        staticmethod,
                        classmethod,
                        types.BuiltinFunctionType,
                        types.MethodType,
                        types.MethodDescriptorType,
                    ),
                ):
                    names.append(name)
            self.methods[kind] = names
        return names

    def _decode(self, tree):
        tag = tree[0]
        if tag == "v":
            return tree[1]
        if tag == "h":
            return self.objects[tree[1]]
        if tag == "d":
            return {self._decode(k): self._decode(v) for k, v in tree[1]}
        return KINDS[tag](self._decode(item) for item in tree[1])

    def _raised(self, error: BaseException) -> tuple:
        message = _safe_str(error)
        if not isinstance(error, Exception):
            return ("fail", f"{type(error).__name__}: {message}"[:300])
        kind = type(error)
        if kind.__module__ == "builtins":
            return ("raise", kind.__name__, None, message)
        return ("raise", kind.__name__, self._handle(kind), message)


_NOT_PLAIN = object()
_EXACT = {
    int: int.__index__,
    str: str.__str__,
    float: float.__float__,
    bytes: bytes.__bytes__,
    complex: complex.__complex__,
    list: list.copy,
    dict: dict.copy,
    set: set.copy,
    tuple: lambda value: tuple.__getitem__(value, slice(None)),
    frozenset: frozenset.copy,
}


def _exact(value):
    """`value` as its exact builtin type, by the builtin's own method (bool and None kept), or _NOT_PLAIN."""
    kind = type(value)
    if kind in SCALARS or kind in CONTAINERS:
        return value
    for base, convert in _EXACT.items():  # a subclass (bool, which has none, is in SCALARS)
        if isinstance(value, base):
            try:
                return convert(value)
            except Exception:  # noqa: BLE001
                return _NOT_PLAIN
    return _NOT_PLAIN


def _builtin_bases(kind: type) -> list[str]:
    return [base.__name__ for base in kind.__mro__ if base.__module__ == "builtins" and issubclass(base, Exception)]


def _safe_str(error: BaseException) -> str:
    try:
        text = str(error)
        return text if type(text) is str else "?"
    except Exception:  # noqa: BLE001
        return "?"


def serve_workspace(files: dict[str, str], request_fd: int, response_fd: int) -> None:
    """Process A: lay the candidate's files out in the working folder, then answer B until it hangs up."""
    for name, text in files.items():
        folder = os.path.dirname(name)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(name, "w", encoding="utf-8") as handle:
            handle.write(text)
    sys.path.insert(0, os.getcwd())
    sys.dont_write_bytecode = True
    forget_modules(candidate_roots(list(files)))
    Workspace(request_fd, response_fd).serve()


def forget_modules(roots: set[str]) -> None:
    """Drop already-imported modules the workspace's own names shadow (this harness's `tasks`, say), so an
    import of that name reaches the workspace; the code already loaded keeps its references."""
    for name in list(sys.modules):
        if name.split(".")[0] in roots:
            del sys.modules[name]


def candidate_roots(files: list[str]) -> set[str]:
    """The top-level module names a workspace's Python files define (`kv/store.py` -> `kv`)."""
    roots = set()
    for name in files:
        if name.endswith(".py"):
            first = name[:-3].split("/")[0]
            if first.isidentifier():
                roots.add(first)
    return roots
