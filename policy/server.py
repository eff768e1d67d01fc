"""A small OpenAI-compatible completions server over the hf backend (`rlvr policy serve`).

It speaks the part of vLLM's `/v1/completions` protocol the `openai` backend uses (n samples,
`logprobs`, `return_tokens_as_token_ids`, `return_token_ids`, `seed`, `stop`, `top_k`), and is as strict
as vLLM where a careless client would train on wrong numbers: the penalties and `min_p` a request
omits come from a generation config (`generation_defaults`, what vLLM reads from the model's
generation_config.json) and change both the samples and the returned log-probs; text prompts are
tokenized with vLLM's default `add_special_tokens: true` (a BOS-adding tokenizer adds one);
`force_repetition_penalty` applies a penalty whatever the request says (a misconfigured server). It serves
model versions under the names `v{N}`, the way vLLM serves one LoRA adapter or checkpoint per
version. `/v1/chat/completions` answers a chat request from the same samples (the messages rendered by the
tokenizer's chat template), as a chat-only judge is asked. It exists so that the `openai` backend and the
publish stage are tested over real HTTP on a machine without a GPU, and so that CPU users can share one
policy between processes.

Two ways to know a version. `on_demand` (the default): any registered version of the lake is
loaded the first time a request names it. Without it the server behaves as vLLM does: it serves
what it was started with (`preload`) and what `POST /v1/load_lora_adapter` loaded (a LoRA adapter
or a full checkpoint folder, by path), forgets what `POST /v1/unload_lora_adapter` names, lists
exactly those in `GET /v1/models`, and answers 404 for any other model name.
`fail_first` makes it answer 503 to its first requests, to exercise clients' retries.

Full weights, as vLLM serves them: with `served_model_name` it serves one model under that one name
(vLLM's `--served-model-name`), and with `dev_mode` (vLLM's `VLLM_SERVER_DEV_MODE=1`) it offers the
routes a trainer swaps weights through: `POST /collective_rpc` calling the methods of the project's
worker extension (`infra/vllm/rlvr_weights.py`: `rlvr_load_checkpoint(path, version)`,
`rlvr_loaded_version()`), `/reset_prefix_cache`, `/pause` and `/resume` (requests wait meanwhile),
`/sleep`, `/wake_up` and `/is_sleeping` (a sleeping server holds requests until it wakes). `GET /openapi.json`
lists the routes, as vLLM's FastAPI does, so that clients detect what a server offers.

Its answers are vLLM 0.32's wherever the platform reads them, and tests/policy/test_server_contract.py checks that on
both servers: worker results as strings (`{"results": ["5"]}`, vLLM's `str(result)`), the dev routes' JSON,
404 for an unknown model or adapter folder, 500 for a failed RPC, no adapter routes on a one-name server.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from policy.checkpoints import load_policy
from policy.hf import HFPolicy
from policy.sampling import NEUTRAL, Penalties, SamplerConfig
from storage.lake import Lake
from storage.registry import version_row


class NotServed(LookupError):
    """A model name this server does not serve (vLLM answers 404)."""


class WorkerFailed(RuntimeError):
    """A dev-mode RPC whose method failed on the worker (vLLM answers 500)."""


class PolicyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        load_version,
        fail_first: int = 0,
        on_demand: bool = True,
        load_path=None,
        preload: tuple[int, ...] = (),
        list_versions=None,
        generation_defaults: dict | None = None,
        force_repetition_penalty: float | None = None,
        served_model_name: str | None = None,
        dev_mode: bool = False,
    ):
        super().__init__(address, CompletionsHandler)
        self.served_model_name = served_model_name  # one name, full weights swapped in place (vLLM's way)
        self.dev_mode = dev_mode
        self.held_version: int | None = None  # the version the one-name server holds
        self.resumed = threading.Event()  # cleared between /pause and /resume
        self.resumed.set()
        self.sleeping = False
        self.prefix_cache_resets = 0
        self.generation_defaults = generation_defaults or {}  # what a request omits (vLLM: generation_config.json)
        self.force_repetition_penalty = force_repetition_penalty
        self.load_version = load_version  # int -> policy: a registered version of the lake
        self.list_versions = list_versions  # () -> versions on_demand can serve, for GET /v1/models
        self.load_path = load_path  # (name, folder) -> policy: what load_lora_adapter loads
        self.on_demand = on_demand
        self.policies: dict[str, object] = {}  # served name -> policy
        self.adapters: set[str] = set()  # names load_lora_adapter loaded (listed with a parent)
        self.roots: dict[str, str] = {}  # served name -> where it was loaded from
        self.lock = threading.Lock()  # one generation or load at a time: the model is not thread-safe
        self.fail_first = fail_first
        self.requests_seen = 0
        if served_model_name:
            self.on_demand, self.held_version = False, (preload or (0,))[0]
            self.policies[served_model_name] = load_version(self.held_version)
            self.roots[served_model_name] = f"model version {self.held_version}"
            return
        for version in preload:
            self.policies[f"v{version}"] = load_version(version)
            self.roots[f"v{version}"] = f"model version {version}"

    def policy(self, name: str):
        if name in self.policies:
            return self.policies[name]
        if not self.on_demand:
            raise NotServed(f"The model `{name}` does not exist. Valid aliases: {', '.join(sorted(self.policies))}.")
        if not (name.startswith("v") and name[1:].isdigit()):
            raise LookupError(f"model {name!r} is not served here: names are v0, v1, ...")
        self.policies[name] = self.load_version(int(name[1:]))
        self.roots[name] = f"model version {name[1:]}"
        return self.policies[name]

    def load(self, name: str, path: str) -> str:
        """vLLM's load_lora_adapter: serve the folder at `path` under `name` (a name is loaded once)."""
        if not name or not path:
            raise ValueError("both lora_name and lora_path are required")
        if name in self.policies:
            raise ValueError(
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                "in place, set 'load_inplace' to True."
            )
        if self.load_path is None:
            raise ValueError("this server cannot load adapters")
        if not Path(path).is_dir():
            raise NotServed(f"Loading lora {name} failed: No adapter found for {path}")
        try:
            self.policies[name] = self.load_path(name, path)
        except Exception as error:  # whatever the folder holds, the server stays up
            raise ValueError(f"cannot load '{name}' from {path}: {type(error).__name__}: {error}") from error
        self.roots[name] = path
        self.adapters.add(name)
        return f"Success: LoRA adapter '{name}' added successfully."

    def collective_rpc(self, body: dict) -> dict:
        """vLLM's dev-mode RPC to every worker (here one): the worker extension's methods. A result goes back
        as vLLM sends it, `str(result)` unless None, a dict or a list; a failing method is a 500."""
        method, args = body.get("method"), list(body.get("args") or [])
        if not method:
            raise ValueError("Missing 'method' in request body")
        try:
            result = self._call(method, args)
        except Exception as error:  # as vLLM: the RPC fails, the server stays up
            raise WorkerFailed(
                f"Call to collective_rpc method failed: Worker failed with error '{error}', please "
                "check the stack trace above for the root cause"
            ) from error
        return {"results": [result if result is None or isinstance(result, dict | list) else str(result)]}

    def _call(self, method: str, args: list):
        if method == "rlvr_loaded_version":
            return self.held_version
        if method == "rlvr_load_checkpoint":
            if not self.served_model_name:
                raise ValueError("this server serves versions by name, not one model's weights")
            path, version = str(args[0]), int(args[1])
            if not Path(path).is_dir():
                raise FileNotFoundError(f"{path}: no such checkpoint folder on this server")
            self.policies[self.served_model_name] = self.load_path(f"v{version}", path)
            self.held_version, self.roots[self.served_model_name] = version, path
            return None
        raise AttributeError(f"'Worker' object has no attribute '{method}'")

    def unload(self, name: str) -> str:
        if name not in self.policies:
            raise NotServed(f"The lora adapter '{name}' cannot be found.")
        del self.policies[name], self.roots[name]
        self.adapters.discard(name)
        return f"Success: LoRA adapter '{name}' removed successfully."


class CompletionsHandler(BaseHTTPRequestHandler):
    server: PolicyServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # quiet: tests and users read the client side
        pass

    def do_GET(self):
        if self.path == "/health":
            return self._reply(200, {"status": "ok"})
        if self.path == "/openapi.json":
            paths = ["/health", "/v1/models", *self._routes()]
            return self._reply(200, {"openapi": "3.1.0", "paths": {route: {} for route in paths}})
        if self.server.dev_mode and self.path == "/is_sleeping":
            return self._reply(200, {"is_sleeping": self.server.sleeping})
        if self.server.dev_mode and self.path == "/is_paused":
            return self._reply(200, {"is_paused": not self.server.resumed.is_set()})
        if self.path == "/v1/models":
            with self.server.lock:
                served = dict(self.server.roots)
            if self.server.on_demand and self.server.list_versions is not None:
                served = {f"v{v}": f"model version {v}" for v in self.server.list_versions()} | served
            base = next((name for name in served if name not in self.server.adapters), None)
            return self._reply(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": name,
                            "object": "model",
                            "owned_by": "vllm",
                            "root": root,
                            "parent": base if name in self.server.adapters else None,
                        }
                        for name, root in sorted(served.items())
                    ],
                },
            )
        self._reply(404, {"detail": "Not Found"})

    def _routes(self) -> dict:
        """POST routes; the dev-mode ones only with dev_mode, as vLLM registers them."""
        server = self.server
        routes = {"/v1/completions": self._complete, "/v1/chat/completions": self._chat}
        if not server.served_model_name:  # vLLM offers adapter routes only with --enable-lora
            routes |= {
                "/v1/load_lora_adapter": lambda body: server.load(
                    str(body.get("lora_name") or ""), str(body.get("lora_path") or "")
                ),
                "/v1/unload_lora_adapter": lambda body: server.unload(str(body.get("lora_name") or "")),
            }
        if server.dev_mode:

            def pause(_):
                server.resumed.clear()
                return {"status": "paused"}

            def resume(_):
                server.resumed.set()
                return {"status": "resumed"}

            def reset(_):
                server.prefix_cache_resets += 1
                return {"success": True}

            def sleep(body):  # vLLM pauses the engine too: requests wait
                server.sleeping = True
                server.resumed.clear()
                return {"status": "sleeping", "level": int(body.get("level") or 1)}

            def wake(_):
                server.sleeping = False
                server.resumed.set()
                return {"status": "awake", "tags": None}

            routes |= {
                "/collective_rpc": server.collective_rpc,
                "/reset_prefix_cache": reset,
                "/pause": pause,
                "/resume": resume,
                "/sleep": sleep,
                "/wake_up": wake,
                "/is_sleeping": None,
                "/is_paused": None,
            }
        return routes

    def do_POST(self):
        route = urlsplit(self.path).path  # /sleep?level=1: the query changes nothing here
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))  # read first: the connection is kept
        routes = self._routes()
        if routes.get(route) is None:
            return self._reply(404, {"detail": "Not Found"})  # FastAPI's answer for a route it lacks
        body = json.loads(raw or b"{}")
        if route in ("/v1/completions", "/v1/chat/completions"):
            self.server.resumed.wait()  # paused or asleep: requests wait, as in vLLM
        else:  # dev routes take their parameters in the query
            body |= {key: values[-1] for key, values in parse_qs(urlsplit(self.path).query).items()}
        if route in ("/pause", "/resume", "/sleep", "/wake_up"):  # never behind the lock a waiting request holds
            return self._reply(200, routes[route](body))
        with self.server.lock:
            self.server.requests_seen += 1
            if self.server.requests_seen <= self.server.fail_first:
                return self._reply(503, {"error": {"message": "warming up (injected failure)"}})
            try:
                self._reply(200, routes[route](body))
            except NotServed as error:
                self._reply(
                    404, {"error": {"message": str(error), "type": "NotFoundError", "param": None, "code": 404}}
                )
            except WorkerFailed as error:
                self._reply(
                    500, {"error": {"message": str(error), "type": "InternalServerError", "param": None, "code": 500}}
                )
            except (LookupError, ValueError, OSError) as error:  # OSError: a folder that cannot be read
                self._reply(
                    400, {"error": {"message": str(error), "type": "BadRequestError", "param": None, "code": 400}}
                )

    def _complete(self, body: dict) -> dict:
        policy = self.server.policy(str(body.get("model", "")))
        prompts = body["prompt"] if isinstance(body.get("prompt"), list) else [body.get("prompt", "")]
        if prompts and all(isinstance(t, int) for t in prompts):  # one prompt as token ids (vLLM accepts it too)
            prompts = [prompts]
        add_special_tokens = bool(body.get("add_special_tokens", True))  # vLLM's default
        tokenizer = getattr(policy, "tokenizer", None)  # a scripted policy has none
        prompts = [
            prompt
            if isinstance(prompt, list) or tokenizer is None
            else tokenizer(prompt, add_special_tokens=add_special_tokens).input_ids
            for prompt in prompts
        ]
        stop = body.get("stop") or []
        setting = self._setting(body)
        sampler = SamplerConfig(
            temperature=setting("temperature", 1.0),
            top_p=setting("top_p", 1.0),
            top_k=max(int(setting("top_k", 0)), 0),
            max_new_tokens=body.get("max_tokens") or setting("max_new_tokens", 16),
            stop=[stop] if isinstance(stop, str) else stop,
        )
        penalties = Penalties(**{name: float(setting(name, neutral)) for name, neutral in NEUTRAL.items()})
        if self.server.force_repetition_penalty is not None:
            penalties = replace(penalties, repetition_penalty=self.server.force_repetition_penalty)
        n = int(body.get("n", 1))
        asked = {} if penalties.neutral else {"penalties": penalties}
        groups = policy.generate(prompts, n, sampler, int(body.get("seed") or 0), policy.model_version, **asked)
        choices = []
        for group in groups:
            for sample in group:
                choice = {
                    "index": len(choices),
                    "text": sample.text,
                    "finish_reason": sample.finish_reason,
                    "logprobs": {
                        "tokens": [f"token_id:{t}" for t in sample.token_ids],
                        "token_logprobs": sample.logprobs,
                        "top_logprobs": None,
                    },
                }
                if body.get("return_token_ids"):
                    choice |= {"token_ids": sample.token_ids, "prompt_token_ids": sample.prompt_token_ids}
                choices.append(choice)
        usage = sum(len(c["logprobs"]["tokens"]) for c in choices)
        return {
            "id": f"cmpl-{self.server.requests_seen}",
            "object": "text_completion",
            "model": body["model"],
            "choices": choices,
            "usage": {"completion_tokens": usage},
        }

    def _chat(self, body: dict) -> dict:
        """`/v1/chat/completions`: the messages rendered by the tokenizer's chat template (with the assistant's
        turn opened), else as `Role: content` paragraphs for a model without one; the completions' samples as
        assistant messages."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "content" in m for m in messages):
            raise ValueError("messages: a list of {role, content} objects is required")
        tokenizer = getattr(self.server.policy(str(body.get("model", ""))), "tokenizer", None)
        if getattr(tokenizer, "chat_template", None):
            try:
                prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            except Exception as error:  # e.g. a template without a system role: a 400, not a drop
                raise ValueError(f"the model's chat template refused the messages: {error}") from None
        else:
            prompt = "".join(f"{str(m.get('role', 'user')).capitalize()}: {m['content']}\n\n" for m in messages)
            prompt += "Assistant:"
        completion = self._complete(
            {key: value for key, value in body.items() if key != "messages"}
            | {"prompt": prompt, "add_special_tokens": False}
        )
        choices = [
            {
                "index": c["index"],
                "message": {"role": "assistant", "content": c["text"]},
                "finish_reason": c["finish_reason"],
            }
            for c in completion["choices"]
        ]
        return {
            "id": f"chatcmpl-{self.server.requests_seen}",
            "object": "chat.completion",
            "model": body["model"],
            "choices": choices,
            "usage": completion["usage"],
        }

    def _setting(self, body: dict):
        """A sampling parameter: the request's, else the generation config's, else vLLM's own default."""
        defaults = self.server.generation_defaults
        return lambda name, default: body[name] if body.get(name) is not None else defaults.get(name, default)

    def _reply(self, status: int, payload: dict | str) -> None:
        plain = isinstance(payload, str)  # vLLM answers adapter loads in plain text, dev routes empty
        data = payload.encode() if plain else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if plain else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def lake_loader(lake_uri: str | None, device: str = "cpu", batch_size: int = 64):
    """Load model version N of a lake's registry as an HFPolicy."""

    lake = Lake.open(lake_uri)
    load = folder_loader(device, batch_size)
    return lambda version: load(f"v{version}", version_row(lake, version)["checkpoint_uri"])


def lake_versions(lake_uri: str | None):
    """The lake's registered version numbers, read at each call (what an on-demand server can serve)."""

    lake = Lake.open(lake_uri)
    return lambda: lake.read("model_versions", columns=["model_version"])["model_version"].sort().to_list()


def folder_loader(device: str = "cpu", batch_size: int = 64):
    """Load a checkpoint or LoRA adapter folder (what `load_lora_adapter` names) as an HFPolicy; a name
    `vN` is model version N, any other name version -1."""

    def load(name: str, path: str) -> HFPolicy:
        model, tokenizer = load_policy(path, device)
        version = int(name[1:]) if name[:1] == "v" and name[1:].isdigit() else -1
        return HFPolicy(model, tokenizer, version, batch_size)

    return load


GENERATION_CONFIG_KEYS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")


def generation_defaults(path: str | None) -> dict:
    """The sampling defaults vLLM takes from a generation_config.json (a file, or a folder holding one):
    only the keys it reads, only those the file states."""
    if not path:
        return {}
    file = Path(path) / "generation_config.json" if Path(path).is_dir() else Path(path)
    try:
        stated = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{file}: not a readable generation config: {error}") from error
    return {key: stated[key] for key in GENERATION_CONFIG_KEYS if stated.get(key) is not None}
