"""Process B's side of the sandbox's object boundary (`remote.py` says why there is one): the candidate's
modules, classes and objects as handles (`Remote`, `RemoteModule`) over a `Connection` to process A, and the
import hook that makes the workspace's own module names resolve to them."""

from __future__ import annotations

import importlib
import importlib.machinery
import marshal
import threading
import time
import types

from tasks.sandbox.protocol import recv_bytes, send_bytes
from tasks.sandbox.remote import KINDS, SCALARS, TAGS, CandidateFailure, CandidateTimeout, is_plain


class Connection:
    """B's end: calls from any of the tests' threads, answers matched by call id, one deadline per test."""

    def __init__(self, request_fd: int, response_fd: int):
        self.request_fd, self.response_fd = request_fd, response_fd
        self.lock = threading.Lock()
        self.pending: dict[int, list] = {}
        self.next_id = 0
        self.deadline: float | None = None
        self.busy = False  # a call timed out: A may still be busy with it
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
                    Exception,
                )
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
        for slot, value in (
            ("_rlvr_connection", connection),
            ("_rlvr_handle", handle),
            ("_rlvr_name", name),
            ("_rlvr_methods", methods),
            ("_rlvr_kind", kind),
        ):
            object.__setattr__(self, slot, value)

    def _rlvr_request(self, op: str, *arguments):
        connection = object.__getattribute__(self, "_rlvr_connection")
        return connection.request(
            op, object.__getattribute__(self, "_rlvr_handle"), *(connection.encode(a) for a in arguments)
        )

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
        return False  # never the candidate's choice: it would swallow the tests' assertions

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
