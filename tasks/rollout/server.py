"""A small OpenAI-compatible completions server over the hf backend (`rlvr policy serve`).

It speaks the part of vLLM's `/v1/completions` protocol the `openai` backend uses (n samples,
`logprobs`, `return_tokens_as_token_ids`, `return_token_ids`, `seed`, `stop`, `top_k`), and serves
every registered model version of a lake under the name `v{N}`, the way vLLM serves one LoRA
adapter or checkpoint per version. It exists so that the `openai` backend is tested over real
HTTP on a machine without a GPU, and so that CPU users can share one policy between processes.
`fail_first` makes it answer 503 to its first requests, to exercise clients' retries.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tasks.rollout.sampling import SamplerConfig


class PolicyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], load_version, fail_first: int = 0):
        super().__init__(address, CompletionsHandler)
        self.load_version = load_version          # int -> HFPolicy
        self.policies: dict[int, object] = {}
        self.lock = threading.Lock()              # one generation at a time: the model is not thread-safe
        self.fail_first = fail_first
        self.requests_seen = 0

    def policy(self, name: str):
        if not (name.startswith("v") and name[1:].isdigit()):
            raise LookupError(f"model {name!r} is not served here: names are v0, v1, ...")
        version = int(name[1:])
        if version not in self.policies:
            self.policies[version] = self.load_version(version)
        return self.policies[version]


class CompletionsHandler(BaseHTTPRequestHandler):
    server: PolicyServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):             # quiet: tests and users read the client side
        pass

    def do_GET(self):
        if self.path == "/health":
            return self._reply(200, {"status": "ok"})
        if self.path == "/v1/models":
            return self._reply(200, {"object": "list", "data": [{"id": f"v{v}", "object": "model"}
                                                                 for v in sorted(self.server.policies)]})
        self._reply(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self):
        if self.path != "/v1/completions":
            return self._reply(404, {"error": {"message": f"no route {self.path}"}})
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        with self.server.lock:
            self.server.requests_seen += 1
            if self.server.requests_seen <= self.server.fail_first:
                return self._reply(503, {"error": {"message": "warming up (injected failure)"}})
            try:
                self._reply(200, self._complete(body))
            except (LookupError, ValueError) as error:
                self._reply(400, {"error": {"message": str(error)}})

    def _complete(self, body: dict) -> dict:
        policy = self.server.policy(str(body.get("model", "")))
        prompts = body["prompt"] if isinstance(body.get("prompt"), list) else [body.get("prompt", "")]
        stop = body.get("stop") or []
        sampler = SamplerConfig(temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0),
                                top_k=max(int(body.get("top_k", 0) or 0), 0), max_new_tokens=body.get("max_tokens", 16),
                                stop=[stop] if isinstance(stop, str) else stop)
        n = int(body.get("n", 1))
        groups = policy.generate(prompts, n, sampler, int(body.get("seed") or 0), policy.model_version)
        choices = []
        for prompt_index, group in enumerate(groups):
            for sample in group:
                choice = {"index": len(choices), "text": sample.text, "finish_reason": sample.finish_reason,
                          "logprobs": {"tokens": [f"token_id:{t}" for t in sample.token_ids],
                                       "token_logprobs": sample.logprobs, "top_logprobs": None}}
                if body.get("return_token_ids"):
                    choice |= {"token_ids": sample.token_ids, "prompt_token_ids": sample.prompt_token_ids}
                choices.append(choice)
        usage = sum(len(c["logprobs"]["tokens"]) for c in choices)
        return {"id": f"cmpl-{self.server.requests_seen}", "object": "text_completion", "model": body["model"],
                "choices": choices, "usage": {"completion_tokens": usage}}

    def _reply(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def lake_loader(lake_uri: str | None, device: str = "cpu", batch_size: int = 64):
    """Load model version N of a lake's registry as an HFPolicy."""
    from storage.lake import Lake
    from tasks.rollout.hf import HFPolicy
    from storage.registry import version_row
    from trainers.registry import load_policy

    lake = Lake.open(lake_uri)

    def load(version: int) -> HFPolicy:
        model, tokenizer = load_policy(version_row(lake, version)["checkpoint_uri"], device)
        return HFPolicy(model, tokenizer, version, batch_size)

    return load
