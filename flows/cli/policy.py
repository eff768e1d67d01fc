"""`rlvr policy …`: the model registry (version 0, the list), the stand-in OpenAI-compatible server, and
publishing a version to inference servers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from flows.cli.common import (
    ConfigOption,
    FormatOption,
    LakeOption,
    fail,
    iteration_config,
    prefect_defaults,
    run_config,
    serve_until_interrupted,
)
from flows.display import TableFormat, console, show_table, use_format

app = typer.Typer(help="The model registry and policy servers.", no_args_is_help=True)


@app.command("init")
def policy_init(config: ConfigOption = None, lake: LakeOption = None, format: FormatOption = TableFormat.table) -> None:
    """Register model version 0 (the embedded tiny model, or the checkpoint the config names)."""
    use_format(format)
    from storage.lake import Lake
    from tasks.rollout.base_policy import ensure_base_policy

    settings = iteration_config(config)
    opened = Lake.open(lake)
    ensure_base_policy(opened, settings.rollout.base_policy)
    policy_list(lake, format)


@app.command("list")
def policy_list(lake: LakeOption = None, format: FormatOption = TableFormat.table) -> None:
    """The registered model versions."""
    use_format(format)
    from storage.lake import Lake
    from storage.registry import versions

    table = versions(Lake.open(lake)).select(
        "model_version", "parent_version", "kind", "checkpoint_uri", "iteration", "created_at"
    )
    show_table(table, title="model versions")


@app.command("serve")
def policy_serve(
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
    host: Annotated[str, typer.Option(help="interface to bind")] = "127.0.0.1",
    device: Annotated[str, typer.Option(help="torch device")] = "cpu",
    fail_first: Annotated[int, typer.Option(help="answer 503 to this many first requests (testing retries)")] = 0,
    on_demand: Annotated[
        bool,
        typer.Option(
            help="load any registered version the first time a request names it; "
            "--no-on-demand serves, as vLLM does, only --preload and what "
            "POST /v1/load_lora_adapter loaded"
        ),
    ] = True,
    preload: Annotated[Optional[list[int]], typer.Option(help="model versions served from the start")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="sequences generated together")] = 64,
    generation_config: Annotated[
        Optional[Path],
        typer.Option(
            help="a generation_config.json (or its folder) whose repetition_penalty, min_p, temperature, top_k, top_p "
            "and max_new_tokens apply to requests that omit them, as vLLM's --generation-config does"
        ),
    ] = None,
    force_repetition_penalty: Annotated[
        Optional[float],
        typer.Option(
            help="apply this repetition penalty whatever a request says: a misconfigured server, for testing "
            "`rlvr policy check`"
        ),
    ] = None,
    served_model_name: Annotated[
        Optional[str],
        typer.Option(
            help="serve one model under this one name, as vLLM does: the first --preload version (default 0), its "
            "full weights swapped in place through POST /collective_rpc (needs --dev-mode)"
        ),
    ] = None,
    dev_mode: Annotated[
        bool,
        typer.Option(
            envvar="VLLM_SERVER_DEV_MODE",
            help="offer vLLM's dev-mode routes: /collective_rpc (the worker "
            "extension's rlvr_load_checkpoint), /reset_prefix_cache, /pause, /resume, /sleep, /wake_up",
        ),
    ] = False,
    lake: LakeOption = None,
) -> None:
    """An OpenAI-compatible completions server over the lake's model versions (served as v0, v1, ...)."""
    from policy.server import PolicyServer, folder_loader, generation_defaults, lake_loader, lake_versions

    try:
        server = PolicyServer(
            (host, port),
            lake_loader(lake, device, batch_size),
            fail_first=fail_first,
            on_demand=on_demand,
            load_path=folder_loader(device, batch_size),
            preload=tuple(preload or ()),
            list_versions=lake_versions(lake),
            generation_defaults=generation_defaults(generation_config and str(generation_config)),
            force_repetition_penalty=force_repetition_penalty,
            served_model_name=served_model_name,
            dev_mode=dev_mode,
        )
    except (ValueError, OSError) as error:
        fail(str(error))
    served = (
        f"model version {server.held_version} as {served_model_name!r}"
        if served_model_name
        else "every registered model version"
        if on_demand
        else f"model version(s) {', '.join(map(str, preload or [])) or 'none'} and what is loaded into it"
    )
    console.print(f"serving {served} of {lake or 'the lake'} on http://{host}:{server.server_port}/v1")
    serve_until_interrupted(server)


@app.command("check")
def policy_check(
    url: Annotated[str, typer.Argument(help="the server's base URL, with or without /v1, e.g. http://127.0.0.1:8000")],
    model: Annotated[
        Optional[str], typer.Option(help="the served model name to check (default: the newest registered version's)")
    ] = None,
    config: ConfigOption = None,
    prompts: Annotated[
        Optional[int],
        typer.Option(min=1, help="prompts sampled, 2 short responses each [default: rollout.logprob_check_prompts]"),
    ] = None,
    tolerance: Annotated[
        Optional[float], typer.Option(help="the most the mean |Δ log p| may be [default: rollout.logprob_tolerance]")
    ] = None,
    lake: LakeOption = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """The log-prob agreement gate: sample a few responses from a server, recompute their behaviour log-probs
    with the trainer's code on the registry's checkpoint, print the gap per token and the importance ratios
    before any update; exit 1 above the tolerance, naming the likely causes. Recorded in `logprob_checks`."""
    use_format(format)
    rollout = iteration_config(config).rollout
    rollout = rollout.model_copy(
        update={
            "logprob_check_prompts": prompts or rollout.logprob_check_prompts or 4,
            "logprob_tolerance": tolerance or rollout.logprob_tolerance,
        }
    )
    prefect_defaults()
    from flows.publishing import check_policy
    from policy.openai_backend import BackendUnavailable
    from storage.lake import Lake

    try:
        agreement = check_policy(Lake.open(lake), rollout, url, model)
    except (BackendUnavailable, ValueError) as error:
        fail(str(error))
    import polars as pl

    row = agreement.as_row()
    show_table(
        pl.DataFrame([row], schema_overrides={"causes": pl.List(pl.String)}), title=f"log-prob agreement of {url}"
    )
    if not agreement.passed:
        fail(
            f"{url}: mean |Δ log p| {agreement.mean_abs_delta:.4f} is above {agreement.tolerance}"
            if agreement.prompt_tokens_match
            else f"{url}: the server tokenized the prompts otherwise"
        )


@app.command("publish")
def policy_publish(
    version: Annotated[int, typer.Argument(help="the model version to load into the servers")],
    config: Annotated[
        Path,
        typer.Option(help="run config whose rollout.openai lists the servers (and publish: max_loras, path_map, ...)"),
    ],
    lake: LakeOption = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """Load a model version into every rollout server (vLLM's load_lora_adapter) and confirm GET /v1/models
    lists it; older versions past publish.max_loras are unloaded. Recorded in `publications`."""
    use_format(format)
    settings = run_config(config)
    if settings.rollout.backend != "openai":
        fail(f"{config}: rollout.backend is {settings.rollout.backend!r}; publishing is for the openai backend", 2)
    prefect_defaults()
    from flows.publishing import publish_policy
    from policy.openai_backend import BackendUnavailable

    try:
        rows = publish_policy(
            version,
            settings.rollout.model_dump(mode="json"),
            settings.publish.model_copy(update={"enabled": True}).model_dump(mode="json"),
            lake,
        )
    except (BackendUnavailable, ValueError) as error:
        fail(str(error))
    import polars as pl

    show_table(
        pl.DataFrame(rows).select("endpoint", "served_name", "action", "unloaded"),
        title=f"model version {version} published",
    )
