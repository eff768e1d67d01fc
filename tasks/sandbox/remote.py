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
import time
import types

from tasks.sandbox.protocol import recv_bytes, send_bytes

SCALARS = (type(None), bool, int, float, complex, str, bytes)
CONTAINERS = (list, tuple, dict, set, frozenset)
TAGS = {list: "l", tuple: "t", set: "s", frozenset: "f"}      # sequences and sets in a tagged tree (dicts: "d")
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
        self.handles: dict[int, int] = {}          # id(object) -> handle
        self.methods: dict[type, list[str]] = {}
        self.lock = threading.Lock()               # the handle table and the response pipe
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.idle = 0
        self.threads = 0

    def serve(self) -> None:
        while True:
            payload = recv_bytes(self.request_fd)
            if payload is None:
                return
            if not self._dispatch(payload):
                self._answer(payload)                  # no thread at all could start: answer it here

    def _dispatch(self, payload: bytes) -> bool:
        """Hand a call to an idle thread or a new one; False when there is none and none can start (the user
        id's process limit counts threads, and other runs under that id may hold them all)."""
        with self.lock:
            if self.idle == 0 and self.threads < MAX_THREADS:
                try:
                    threading.Thread(target=self._work, daemon=True).start()
                    self.threads += 1
                except RuntimeError:                   # "can't start new thread"
                    if self.threads == 0:
                        return False
                    self.idle -= 1                     # it waits for one of the threads there are
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
                if not name.startswith("__") and isinstance(attribute, (types.FunctionType, staticmethod, classmethod,
                                                                        types.BuiltinFunctionType, types.MethodType,
                                                                        types.MethodDescriptorType)):
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
_EXACT = {int: int.__index__, str: str.__str__, float: float.__float__, bytes: bytes.__bytes__,
          complex: complex.__complex__, list: list.copy, dict: dict.copy, set: set.copy,
          tuple: lambda value: tuple.__getitem__(value, slice(None)), frozenset: frozenset.copy}


def _exact(value):
    """`value` as its exact builtin type, by the builtin's own method (bool and None kept), or _NOT_PLAIN."""
    kind = type(value)
    if kind in SCALARS or kind in CONTAINERS:
        return value
    for base, convert in _EXACT.items():           # a subclass (bool, which has none, is in SCALARS)
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


# ---- process B: the tests' side ---------------------------------------------------------------
class Connection:
    """B's end: calls from any of the tests' threads, answers matched by call id, one deadline per test."""

    def __init__(self, request_fd: int, response_fd: int):
        self.request_fd, self.response_fd = request_fd, response_fd
        self.lock = threading.Lock()
        self.pending: dict[int, list] = {}
        self.next_id = 0
        self.deadline: float | None = None
        self.busy = False              # a call timed out: A may still be busy with it
        self.gone = False
        self.exception_classes: dict[int, type] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def request(self, op: str, *arguments):
        if self.busy:
            raise CandidateTimeout("not run: the candidate is still busy with an earlier test")
        if self.gone:
            raise CandidateFailure("the candidate process is gone")
        done = threading.Event()
        slot = [done, None]
        with self.lock:
            self.next_id += 1
            call_id = self.next_id
            self.pending[call_id] = slot
            try:
                send_bytes(self.request_fd, marshal.dumps((call_id, op, arguments)))
            except OSError:
                self.gone = True
                raise CandidateFailure("the candidate process is gone") from None
        timeout = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
        if not done.wait(timeout):
            self.busy = True
            raise CandidateTimeout("timed out: the test's deadline passed")
        if slot[1] is None:
            raise CandidateFailure("the candidate process exited or sent garbage")
        return self._answer(slot[1])

    def _read(self) -> None:
        while True:
            try:
                payload = recv_bytes(self.response_fd)
                message = None if payload is None else marshal.loads(payload)
            except Exception:  # noqa: BLE001 - A may write anything: garbage ends the connection
                message = None
            if not (isinstance(message, tuple) and len(message) == 2 and type(message[0]) is int):
                break
            with self.lock:
                slot = self.pending.pop(message[0], None)
            if slot is not None:
                slot[1] = message[1]
                slot[0].set()
        self.gone = True
        with self.lock:
            waiting, self.pending = list(self.pending.values()), {}
        for slot in waiting:
            slot[0].set()

    def _answer(self, reply):
        if not isinstance(reply, tuple) or not reply:
            raise CandidateFailure("malformed answer")
        if reply[0] == "ok" and len(reply) == 2:
            return self.decode(reply[1])
        if reply[0] == "raise" and len(reply) == 4 and type(reply[1]) is str and type(reply[3]) is str:
            raise self._exception(reply[1], reply[2])(reply[3])
        if reply[0] == "fail" and len(reply) == 2 and type(reply[1]) is str:
            raise CandidateFailure(reply[1])
        raise CandidateFailure("malformed answer")

    def _exception(self, name: str, handle) -> type:
        if handle is None:
            return _builtin_exception(name) or CandidateFailure
        value = self.decode(handle)
        return value if isinstance(value, type) and issubclass(value, Exception) else CandidateFailure

    def decode(self, tree):
        if not isinstance(tree, tuple) or not tree or type(tree[0]) is not str:
            raise CandidateFailure("malformed answer")
        tag = tree[0]
        if tag == "v" and len(tree) == 2 and is_plain(tree[1]):
            return tree[1]
        if tag == "h" and len(tree) >= 5 and type(tree[1]) is int and type(tree[3]) is str:
            return self._remote(tree)
        if tag == "d" and len(tree) == 2 and type(tree[1]) is list:
            return {self.decode(k): self.decode(v) for k, v in tree[1]}
        if tag in KINDS and len(tree) == 2 and type(tree[1]) is list:
            return KINDS[tag](self.decode(item) for item in tree[1])
        raise CandidateFailure("malformed answer")

    def _remote(self, tree):
        handle, kind, name = tree[1], tree[2], tree[3]
        if kind == "exception_class":
            known = self.exception_classes.get(handle)
            if known is None:
                bases = tuple(filter(None, map(_builtin_exception, tree[5] if len(tree) > 5 else [])))[:1] or (
                    Exception,)
                known = type(name if name.isidentifier() else "CandidateError", bases, {"__module__": "candidate"})
                self.exception_classes[handle] = known
            return known
        methods = frozenset(m for m in tree[4] if type(m) is str) if isinstance(tree[4], list) else frozenset()
        return Remote(self, handle, name, methods, kind)

    def encode(self, value, depth: int = 0):
        if isinstance(value, Remote):
            return ("h", object.__getattribute__(value, "_rlvr_handle"))
        kind = type(value)
        if kind in SCALARS:
            return ("v", value)
        if depth < 50 and kind is dict:
            return ("d", [(self.encode(k, depth + 1), self.encode(v, depth + 1)) for k, v in value.items()])
        if depth < 50 and kind in TAGS:
            return (TAGS[kind], [self.encode(i, depth + 1) for i in value])
        raise TypeError(f"only plain data and the candidate's own objects can be passed to it, not {kind.__name__}")


_BUILTINS = {name: value for name, value in vars(__import__("builtins")).items() if isinstance(value, type)}


def _builtin_exception(name) -> type | None:
    """The builtin `Exception` subclass of that name, or None."""
    kind = _BUILTINS.get(name) if type(name) is str else None
    return kind if kind is not None and issubclass(kind, Exception) else None


class Remote:
    """An object of the candidate's, as the tests see it."""

    __slots__ = ("_rlvr_connection", "_rlvr_handle", "_rlvr_name", "_rlvr_methods", "_rlvr_kind", "__weakref__")

    def __init__(self, connection: Connection, handle: int, name: str, methods: frozenset, kind: str):
        for slot, value in (("_rlvr_connection", connection), ("_rlvr_handle", handle), ("_rlvr_name", name), ("_rlvr_methods", methods),
                            ("_rlvr_kind", kind)):
            object.__setattr__(self, slot, value)

    def _rlvr_request(self, op: str, *arguments):
        connection = object.__getattribute__(self, "_rlvr_connection")
        return connection.request(op, object.__getattribute__(self, "_rlvr_handle"),
                                  *(connection.encode(a) for a in arguments))

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in object.__getattribute__(self, "_rlvr_methods"):
            return _Method(self, name)
        return self._rlvr_request("getattr", name)

    def __setattr__(self, name: str, value) -> None:
        self._rlvr_request("setattr", name, value)

    def __call__(self, *args, **kwargs):
        return self._rlvr_request("call", list(args), kwargs)

    def __len__(self) -> int:
        value = self._rlvr_request("len")
        if type(value) is not int:
            raise CandidateFailure("len() answered with something other than an int")
        return value

    def __iter__(self):
        return self._rlvr_request("iter")

    def __next__(self):
        return self._rlvr_request("next")

    def __contains__(self, item) -> bool:
        return self._rlvr_request("contains", item) is True

    def __getitem__(self, key):
        return self._rlvr_request("getitem", key)

    def __setitem__(self, key, value) -> None:
        self._rlvr_request("setitem", key, value)

    def __delitem__(self, key) -> None:
        self._rlvr_request("delitem", key)

    def __bool__(self) -> bool:
        return self._rlvr_request("bool") is True

    def __str__(self) -> str:
        value = self._rlvr_request("str")
        return value if type(value) is str else "<candidate object>"

    def __repr__(self) -> str:
        return f"<candidate {object.__getattribute__(self, '_rlvr_name')}>"

    def __enter__(self):
        return self._rlvr_request("enter")

    def __exit__(self, *exc) -> bool:
        self._rlvr_request("exit")
        return False               # never the candidate's choice: it would swallow the tests' assertions

    __eq__ = object.__eq__
    __hash__ = object.__hash__


class _Method:
    """A method of a candidate object, called in one round trip."""

    __slots__ = ("_owner", "_rlvr_name")

    def __init__(self, owner: Remote, name: str):
        self._owner, self._rlvr_name = owner, name

    def __call__(self, *args, **kwargs):
        return self._owner._rlvr_request("method", self._rlvr_name, list(args), kwargs)


class RemoteImporter:
    """A meta path finder in B: the candidate's module names import as handles on A's modules."""

    def __init__(self, connection: Connection, roots: set[str]):
        self.connection, self.roots = connection, roots

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname.split(".")[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return RemoteModule(spec.name, self.connection)

    def exec_module(self, module) -> None:
        object.__setattr__(module, "_remote", self.connection.request("import", module.__name__))


class RemoteModule(types.ModuleType):
    """A candidate module: its attributes are fetched from A on every access."""

    def __init__(self, name: str, connection: Connection):
        super().__init__(name)
        self.__path__ = []
        self._connection = connection

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_remote", "_connection"):
            raise AttributeError(name)
        remote = self.__dict__.get("_remote")
        if remote is None:
            raise AttributeError(name)
        return getattr(remote, name)


def candidate_roots(files: list[str]) -> set[str]:
    """The top-level module names a workspace's Python files define (`kv/store.py` -> `kv`)."""
    roots = set()
    for name in files:
        if name.endswith(".py"):
            first = name[:-3].split("/")[0]
            if first.isidentifier():
                roots.add(first)
    return roots

