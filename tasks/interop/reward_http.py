"""The HTTP side of `rlvr reward serve`: routes onto a `RewardService`, an optional bearer token and a limit on
a request's size.

- `GET /health` is open; every other route, an unknown one included, wants `Authorization: Bearer TOKEN` when
  the server has a token (401 without it or with another; compared in constant time).
- A body over `max_request_bytes` is a 413, answered before it is read (then drained, so that the client reads
  the answer rather than a reset connection, up to `DRAIN_FACTOR` times the limit; a larger one is cut off). A
  request without the token is drained up to `UNAUTHORIZED_DRAIN` only: a stranger's body costs the server
  little.
- Errors are `{"error": "..."}`: 400 an unreadable request, 403 a run the server may not write, 500 a failed
  commit.
"""

from __future__ import annotations

import hmac
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from tasks.interop.reward_service import BadRequest, Forbidden, RewardService

MiB = 1 << 20
# OpenRLHF posts one response a request (a 32k-token one is about 0.15 MB of JSON); versions before its
# `agent.py` posted a whole rollout batch at once: 1,024 responses of 16k tokens with their prompts, about 75 MB.
# The default of `rlvr reward serve --max-request-mb`.
DEFAULT_MAX_REQUEST_MB = 128
DRAIN_FACTOR = 4
UNAUTHORIZED_DRAIN = MiB
CHUNK = MiB


def read_token(path: Path) -> str:
    """The bearer token in `path` (its one line), read once when the server starts."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        raise ValueError(f"--token-file {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"--token-file {path}: cannot be read ({error})") from None
    if not token:
        raise ValueError(f"--token-file {path} is empty: write the token in it (one line)")
    if any(character.isspace() or not character.isprintable() for character in token):
        raise ValueError(f"--token-file {path}: the token must be one line of printable characters with no spaces")
    return token


class RewardServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        service: RewardService,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_MB * MiB,
        token: str | None = None,
    ):
        if max_request_bytes < 1:
            raise ValueError(f"the request size limit must be at least 1 byte, got {max_request_bytes}")
        self.service, self.max_request_bytes = service, max_request_bytes
        self.token = None if token is None else token.encode()
        super().__init__(address, RewardHandler)


class RewardHandler(BaseHTTPRequestHandler):
    server: RewardServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args) -> None:  # one line per request is noise at thousands a second
        pass

    def do_GET(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        if path == "/health":
            self._answer(200, {"status": "ok", "bank_problems": len(self.server.service.bank)})
        elif self._authorized(unread=0):
            self._answer(404, {"error": f"no route GET {path}: GET /health, POST /get_reward or /v1/rewards"})

    def do_POST(self) -> None:
        length = self._length()
        if length is None or not self._authorized(length):
            return
        path = urlsplit(self.path).path.rstrip("/")
        routes = {"/get_reward": self.server.service.openrlhf, "/v1/rewards": self.server.service.native}
        route = routes.get(path)
        if route is None:
            self._refuse(404, f"no route POST {path}: POST /get_reward (OpenRLHF) or /v1/rewards", length)
            return
        if length > self.server.max_request_bytes:
            self._refuse(
                413,
                f"the request holds {length:,} bytes, over this server's limit of "
                f"{self.server.max_request_bytes:,} (--max-request-mb): send fewer responses a "
                "request",
                length,
            )
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            self._answer(200, route(body))
        except (BadRequest, json.JSONDecodeError, UnicodeDecodeError) as error:
            self._answer(400, {"error": str(error)})
        except Forbidden as error:
            self._answer(403, {"error": str(error)})
        except RuntimeError as error:
            self._answer(500, {"error": str(error)})

    def _length(self) -> int | None:
        """The body's length from its header; None once a refusal is sent (the connection then closes)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self._refuse(411, "send the body with a Content-Length (chunked bodies are not read)", None)
            return None
        header = self.headers.get("Content-Length") or "0"
        if not header.isdigit():
            self._refuse(400, f"Content-Length {header!r} is not a number of bytes", None)
            return None
        return int(header)

    def _authorized(self, unread: int) -> bool:
        """True without a server token or with the right bearer; else answers 401 and returns False."""
        if self.server.token is None:
            return True
        scheme, _, given = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.server.token):
            return True
        why = "no bearer token" if not given.strip() else "wrong bearer token"
        self._refuse(
            401,
            f"{why}: send the header `Authorization: Bearer TOKEN`, the token of the server's "
            "--token-file (only GET /health is open)",
            unread,
            {"WWW-Authenticate": 'Bearer realm="rlvr reward serve"'},
            UNAUTHORIZED_DRAIN,
        )
        return False

    def _refuse(
        self, status: int, error: str, unread: int | None, headers: dict | None = None, drain: int | None = None
    ) -> None:
        """Answer before the body is read, then drain it (None: the length is unknown) if it is at most `drain`
        bytes (default `DRAIN_FACTOR` × the limit), and close."""
        self.close_connection = True
        self._answer(status, {"error": error}, {"Connection": "close", **(headers or {})})
        if unread is not None and unread <= (
            drain if drain is not None else DRAIN_FACTOR * self.server.max_request_bytes
        ):
            while unread > 0 and (read := len(self.rfile.read(min(CHUNK, unread)))):
                unread -= read

    def _answer(self, status: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
