"""The policy: model code every stage and the trainer share. Checkpoints saved and loaded (`checkpoints.py`, with
the in-memory copies of recent ones in `cache.py`), torch's thread count (`threads.py`), the embedded tiny model
and its tokenizer (`tiny.py`), prompt templates (`prompts.py`), the log-prob pass (`logprobs.py`), the samplers:
transformers in this process (`hf.py`) and OpenAI-compatible servers (`openai_backend.py`, their addresses in
`endpoints.py`), both behind `sampling.py`'s `Policy`; self-certainty for a backend that does not report it
(`certainty.py`), the engine agreement gate (`agreement.py`), publishing a version to running servers
(`publish.py`, `layout.py`), starting vLLM servers (`vllm_servers.py`) and serving a policy over HTTP (`server.py`).

May import: `storage` only (the `floors` contract); never Prefect, Typer, `tasks`, `trainers`, `flows` or
`bench`."""
