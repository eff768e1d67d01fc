"""`rlvr bench peer`: the project's loop against TRL's GRPOTrainer on the same learning work, TRL at its best.

One warmed-up lake is made first (the learning config's bank and warm-up, version 1, and its held-out
evaluation). Both sides' settings are derived from the one config (`mirror`): what must be equal is
printed side by side and checked, and a config that TRL cannot mirror is refused before any work.
TRL's batch settings are then swept (micro-batch with gradient accumulation, steps per generation; one
optimizer step per `prompts × G` rollouts always) and its fastest is used; so are ours' micro-batch sizes
(`train.micro_batch_size`) in each of ours' loop modes (`--mode` to fix one): `sync` samples and trains in
turn, as TRL's trainer does; `async` samples the next step while one trains, one version behind, with the
overlapped loop's objective (`in_mode`: configs/async.yaml's), which TRL's trainer cannot, and is said so.
Then, for each seed,
from the same checkpoint, with the same evaluation problems and sampling seed on both sides:

- **ours**: `rl_loop` for `steps` iterations in a copy of the lake, everything written as usual, with
  sampling guided by the lake's history: the difficulty ledger orders the draw (`dynamic_sampling.selection`)
  and the predictions size each round (`dynamic_sampling.guidance`);
- **ours, fixed** (`--compare-fixed`): the same with both off (the mix's random draw, the fixed
  `oversample`), to show what they change: rollouts sampled per kept group and per optimizer step, problems
  retired and revisited, and accuracy;
- **TRL**: a `GRPOTrainer` with the mirrored settings, the project's own verifier as its reward.

Every checkpoint is scored by the same code (`tasks.evaluation.evaluate`), after the side's run: RL wall time
holds no evaluation on either side; what a process pays once (Prefect's temporary server, the model stack's imports) is paid
before either side is timed, and so is each side's setup: TRL's clock starts at `trainer.train()` (after the
trainer is built), ours at step 1's first stage run and stops at the last step's end (after the flow has
started and loaded the policy; every stage run and the bookkeeping between them inside). Reported: accuracy per checkpoint as mean ± 95 % interval over the seeds and
the paired difference (ours − TRL, the same seed's problems); RL wall time and its ratio (target ≤ 1.0);
time to accuracy — the RL seconds each side's mean curve needs to first reach TRL's final mean accuracy,
interpolated between checkpoints — and its ratio (target ≤ 0.7).
"""

from __future__ import annotations

import copy
import shutil
import statistics
import tempfile
import time

import polars as pl
import pyarrow.compute as pc

from bench.peer_lake import lake_intact, sampling_drawn, selected
from bench.peer_stats import arm_against_arm, interval, mean_curve, time_to_accuracy
from bench.peer_trl import (  # noqa: F401  (CannotMirror: the command catches it here)
    TRL_LAYOUTS,
    CannotMirror,
    mirror,
    trl_arguments,
    trl_layout,
)
from bench.results import LOOP_CODE
from bench.stage_time import outside_share
from bench.warm import copy_of, started_once, warmed_once
from storage.lake import Lake

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = (
    "bench/peer.py",
    "bench/peer_trl.py",
    "bench/peer_stats.py",
    "bench/peer_lake.py",
    "bench/warm.py",
    "bench/stage_time.py",
    "configs/demo-learn.yaml",
    "configs/demo.yaml",
    "configs/peer-epochs.yaml",
    *LOOP_CODE,
)

TARGET_RATIO = 1.0
TARGET_TIME_TO_ACCURACY = 0.7
TARGET_PER_KEPT_GROUP = 0.8  # ours' rollouts per kept group against the fixed-oversampling arm's
# Ours' micro-batch sizes swept (sequences per forward and backward pass; the config's own is always tried).
OURS_MICRO_BATCHES = (64, 128, 256)
# Ours' loop modes swept: in turn as TRL's trainer, or overlapped (the next step sampled while one trains).
OURS_MODES = ("sync", "async")


def in_mode(config, mode: str):
    """A copy of the run config in one loop mode. `async` takes the overlapped loop's objective unless the config
    has its own off-policy correction: AReaL's decoupled loss, each token weighted from the training step's own
    forward pass, no extra pass in the advantage stage (configs/async.yaml). On a step's own fresh rollouts (the
    sync loop) it is the same loss: the proximal policy is the behaviour policy, every weight 1."""
    settings = config.model_copy(deep=True)
    settings.loop.mode = mode
    if mode == "async" and settings.train.off_policy_loss != "decoupled":
        settings.train.off_policy_loss, settings.advantages.off_policy_weight = "decoupled", "none"
    return settings


def ours(
    config, base: str, seed: int, steps: int, eval_every: int, guided: bool, micro_batch_size: int, mode: str
) -> dict:
    """Our loop from the warmed version in a copy of `base`: RL seconds, the curve and its RL seconds per
    checkpoint, stage times, and what sampling drew.

    The loop runs without evaluation and its checkpoints are scored after it, as TRL's are: so the clock holds
    no evaluation in either loop mode (the overlapped loop would evaluate beside its next step and slow it), and
    a checkpoint's RL seconds are those up to the end of the training step that made it. The start model is
    loaded before the clock (into the process's checkpoint cache, where step 1 finds it), as TRL's trainer
    loads it before its timed `train()`."""
    from flows.loop import rl_loop
    from policy.checkpoints import load_policy
    from storage.registry import latest_version, version_row
    from tasks.evaluation import evaluate, overall_solve_rate
    from tasks.iteration import IterationConfig

    lake_uri = copy_of(base, f"rlvr-peer-ours-{seed}-")
    lake = Lake.open(lake_uri)
    load_policy(version_row(lake, latest_version(lake))["checkpoint_uri"])
    settings = in_mode(config, mode)
    settings.rollout.seed, settings.train.seed, settings.evaluation.seed = seed, seed, seed
    settings.loop.evaluate_every = 0
    settings.train.micro_batch_size = micro_batch_size
    settings.dynamic_sampling.guidance.enabled = guided
    settings.dynamic_sampling.selection.enabled = guided
    rl_loop(settings.model_dump(mode="json"), steps, lake_uri)
    runs = lake.read("runs", filter=pc.field("iteration") > 0)
    began, ended = runs["started_at"].min(), runs["ended_at"].max()  # step 1's first stage to the last's end
    wall = (ended - began).total_seconds()
    runs = runs.with_columns(
        seconds=(pl.col("ended_at") - pl.col("started_at")).dt.total_microseconds() / 1e6,
        since_start=(pl.col("ended_at") - began).dt.total_microseconds() / 1e6,
    )
    stages = {stage: float(part["seconds"].sum()) for (stage,), part in runs.group_by("stage")}
    trained = runs.filter(pl.col("stage") == "train").group_by("iteration").agg(pl.col("since_start").max())
    elapsed = {int(i): float(t) for i, t in trained.rows() if eval_every and i % eval_every == 0}
    measured = {
        "rl_seconds": wall,
        "stages": stages,
        "outside": outside_share(runs),
        "sampling": sampling_drawn(lake, steps) | selected(lake, settings, steps),
        "lake_intact": lake_intact(lake, steps),
        "mode": mode,
        "micro_batch_size": micro_batch_size,
        "elapsed": elapsed,
        "curve": {},
    }
    versions = lake.read("model_versions", columns=["model_version", "iteration", "kind"]).filter(
        pl.col("kind") == "rl"
    )
    iteration_settings = IterationConfig.model_validate(settings.model_dump(include=set(IterationConfig.model_fields)))
    for step in sorted(elapsed):  # scored after the run: not in its wall time
        version = int(versions.filter(pl.col("iteration") == step)["model_version"][0])
        evaluation, _ = evaluate(lake, settings.evaluation, iteration_settings, version)
        measured["curve"][step] = overall_solve_rate(evaluation)
    shutil.rmtree(lake_uri)  # a version's checkpoint a step: hundreds of MB a run
    return measured


def micro_batch_sizes(config) -> list[int]:
    """Ours' micro-batch sizes to sweep: the swept ones up to a step's trained rows, and the config's own."""
    rows = config.dynamic_sampling.groups_per_batch * config.rollout.group_size
    return sorted({size for size in OURS_MICRO_BATCHES if size <= rows} | {min(config.train.micro_batch_size, rows)})


def ours_sweep(config, base: str, steps: int, modes: tuple[str, ...], console) -> dict:
    """Ours at each loop mode and micro-batch size for `steps` steps (seed 0, guided, no evaluation): seconds
    per step; the fastest is the one compared, as TRL's fastest layout is."""
    timed = []
    for mode in modes:
        for size in micro_batch_sizes(config):
            seconds = isolated(ours, config, base, 0, steps, 0, True, size, mode)["rl_seconds"] / steps
            timed.append({"mode": mode, "micro_batch_size": size, "seconds_per_step": seconds})
            console.print(f"ours, {mode}, micro-batch {size}: {seconds:.2f} s a step")
    return {"layouts": timed, "fastest": min(timed, key=lambda row: row["seconds_per_step"])}


def isolated(function, *args) -> dict:
    """`function(*args)` (one side's run) in a fresh spawned process of its own, which pays Prefect's start and the
    model stack's imports before the run's clock: what a run leaves in a process cannot slow the next side's.
    Measured in one process: TRL's steps ran ~17 % slower after ours' overlapped loop (1.80 → 2.07-2.18 s a step
    over 10 steps; after the sync loop 1.81-1.86)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=started_once) as pool:
        return pool.submit(function, *args).result()


def trl(config, mirrored: dict, layout: dict, base: str, seed: int, steps: int, eval_every: int | None) -> dict:
    """TRL's GRPOTrainer from the warmed version with the mirrored settings and one batch layout: RL seconds,
    and with `eval_every` the curve (scored by our evaluation) and its RL seconds per checkpoint."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from flows.warmup import warmup_version
    from policy.checkpoints import load_policy, save_checkpoint
    from policy.prompts import format_prompt
    from policy.threads import use_given_cores
    from storage.registry import BRANCH, next_version_number, register, version_row
    from tasks.evaluation import evaluate, overall_solve_rate
    from tasks.iteration import IterationConfig
    from tasks.rollout.stage import training_bank
    from tasks.verification.stage import PROBLEM_FIELDS, score_rollouts, verifier_pool

    lake = Lake.open(copy_of(base, f"rlvr-peer-trl-{seed}-"))
    warm = warmup_version(lake)
    model, tokenizer = load_policy(version_row(lake, warm)["checkpoint_uri"])
    use_given_cores()
    bank = training_bank(lake, config.rollout.mix)
    problems = {row["problem_id"]: row for row in bank.select(PROBLEM_FIELDS).iter_rows(named=True)}
    dataset = Dataset.from_dict(
        {
            "prompt": [format_prompt(p, config.rollout.prompt, tokenizer) for p in bank["prompt"]],
            "problem_id": bank["problem_id"].to_list(),
        }
    )
    pool = None  # the verifier pool, open while TRL trains

    def reward(prompts, completions, problem_id, **_) -> list[float]:
        frame = pl.DataFrame(
            [
                {**problems[pid], "rollout_id": str(i), "iteration": 0, "response": text}
                for i, (pid, text) in enumerate(zip(problem_id, completions))
            ]
        )
        return score_rollouts(frame, config.verify, pool)["reward"].fill_null(0.0).to_list()

    args = trl_arguments(mirrored, layout, seed, steps, tempfile.mkdtemp(prefix="rlvr-peer-trl-out-"))
    kept: dict[int, dict] = {}
    clock = {"copying": 0.0, "elapsed": {}}

    class KeepWeights(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if eval_every and state.global_step % eval_every == 0:
                now = time.perf_counter()
                clock["elapsed"][state.global_step] = now - clock["started"] - clock["copying"]
                kept[state.global_step] = copy.deepcopy(model.state_dict())
                clock["copying"] += time.perf_counter() - now

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[KeepWeights()],
    )
    with verifier_pool(config.verify) as pool:  # noqa: F811  (the reward closure reads it)
        clock["started"] = time.perf_counter()
        trainer.train()
        rl_seconds = time.perf_counter() - clock["started"] - clock["copying"]
    settings = IterationConfig.model_validate(config.model_dump(include=set(IterationConfig.model_fields)))
    evaluation_config = config.evaluation.model_copy(update={"seed": seed})
    curve = {}
    for step, weights in sorted(kept.items()):  # scored after training: not in TRL's wall time
        model.load_state_dict(weights)
        with lake.run("bench-peer", "register", {"peer": "trl", "seed": seed, "step": step}) as run:
            version = next_version_number(lake)
            register(
                lake,
                run,
                version,
                uri=save_checkpoint(lake, version, model, tokenizer),
                kind=BRANCH,
                parent=warm,
                metrics={"peer": "trl", "seed": seed, "step": step},
            )
        evaluation, _ = evaluate(lake, evaluation_config, settings, version)
        curve[step] = overall_solve_rate(evaluation)
    shutil.rmtree(lake.uri)
    shutil.rmtree(args.output_dir, ignore_errors=True)
    return {"rl_seconds": rl_seconds, "curve": curve, "elapsed": clock["elapsed"]}


def sweep(config, mirrored: dict, base: str, steps: int, console) -> dict:
    """Each TRL batch layout for `steps` steps (seed 0): seconds per step; the fastest is the one compared."""
    timed = []
    for fractions in TRL_LAYOUTS:
        layout = trl_layout(config, fractions)
        seconds = isolated(trl, config, mirrored, layout, base, 0, steps, None)["rl_seconds"] / steps
        timed.append({**layout, "seconds_per_step": seconds})
        console.print(f"TRL layout {layout}: {seconds:.2f} s a step")
    return {"layouts": timed, "fastest": min(timed, key=lambda row: row["seconds_per_step"])}


def run_benchmark(
    config_path: str,
    steps: int,
    seeds: list[int],
    eval_every: int,
    work: str | None = None,
    sweep_steps: int = 6,
    compare_fixed: bool = True,
    mode: str | None = None,
) -> dict:
    """The comparison; `mode` fixes ours' loop mode (else the faster of `OURS_MODES` over the sweep)."""
    from rich.console import Console
    from rich.table import Table

    from flows.run_config import load_run_config

    console = Console()
    config = load_run_config(config_path)
    mirrored = mirror(config)
    settings_table = Table(title="the settings both sides run with (from one config)")
    for column in ("setting", "ours", "TRL GRPOTrainer"):
        settings_table.add_column(column)
    for name, ours_value, trl_value in mirrored["rows"]:
        settings_table.add_row(name, str(ours_value), str(trl_value))
    console.print(settings_table)
    console.print(
        "not mirrored, by design: ours draws extra groups and trains only on those with signal "
        "(dynamic sampling); each side's micro-batching is its own speed setting, and so is ours' loop "
        "mode (async samples the next step while one trains: TRL's GRPOTrainer samples and trains in turn)"
    )
    base = warmed_once(config_path, work or tempfile.mkdtemp(prefix="rlvr-bench-peer-"), console)
    warmed = Lake.open(base).read("iteration_metrics", filter=pc.field("iteration") == 0)
    start = float(warmed["eval_solve_rate"][0])
    layouts = sweep(config, mirrored, base, sweep_steps, console)
    ours_layouts = ours_sweep(config, base, sweep_steps, (mode,) if mode else OURS_MODES, console)
    mode, micro = ours_layouts["fastest"]["mode"], ours_layouts["fastest"]["micro_batch_size"]
    console.print(f"ours runs {mode}, micro-batch {micro}; TRL {layouts['fastest']}")
    fastest = {
        key: layouts["fastest"][key]
        for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation")
    }
    sides = ("ours", "fixed", "trl") if compare_fixed else ("ours", "trl")
    results = {side: [] for side in sides}
    for seed in seeds:
        results["ours"].append(isolated(ours, config, base, seed, steps, eval_every, True, micro, mode))
        if compare_fixed:
            results["fixed"].append(isolated(ours, config, base, seed, steps, eval_every, False, micro, mode))
        results["trl"].append(isolated(trl, config, mirrored, fastest, base, seed, steps, eval_every))
        console.print(f"seed {seed}: " + ", ".join(f"{side} {results[side][-1]['rl_seconds']:.1f} s" for side in sides))
    summary = summarize(results, start, steps, seeds, layouts, mirrored, console)
    return {**summary, "ours_settings": {**ours_layouts["fastest"], "sweep": ours_layouts["layouts"]}}


def summarize(
    results: dict, start: float, steps: int, seeds: list[int], layouts: dict, mirrored: dict, console
) -> dict:
    """The verdicts: accuracy intervals and paired differences per checkpoint, wall-time and time-to-accuracy
    ratios, what guided sampling changed."""
    from rich.table import Table

    checkpoints = sorted(set.intersection(*(set(r["curve"]) for side in results for r in results[side])))
    table = Table(title=f"held-out solve rate from the warm-up's {start:.1%}: mean ± 95 % interval over seeds {seeds}")
    for column in ("step", *results, "ours − TRL (paired)"):
        table.add_column(column)
    accuracy, paired = {}, {}
    for step in checkpoints:
        accuracy[step] = {side: interval([r["curve"][step] for r in results[side]]) for side in results}
        paired[step] = interval([o["curve"][step] - t["curve"][step] for o, t in zip(results["ours"], results["trl"])])
        table.add_row(
            str(step),
            *(f"{m:.1%} ± {h:.1%}" for m, h in accuracy[step].values()),
            f"{paired[step][0]:+.1%} ± {paired[step][1]:.1%}",
        )
    console.print(table)
    wall = {side: statistics.mean(r["rl_seconds"] for r in results[side]) for side in results}
    ratio = wall["ours"] / wall["trl"]
    target = accuracy[checkpoints[-1]]["trl"][0]
    reached = {side: time_to_accuracy(mean_curve(results[side], start), target) for side in results}
    time_ratio = reached["ours"] / reached["trl"] if reached["ours"] is not None and reached["trl"] else None
    last_low = paired[checkpoints[-1]][0] - paired[checkpoints[-1]][1]
    ahead = all(paired[step][0] >= 0 for step in checkpoints) and last_low >= 0
    console.print(
        f"RL wall time for {steps} steps (evaluation excluded): "
        + ", ".join(f"{side} {seconds:.1f} s" for side, seconds in wall.items())
        + f" — ours / TRL ×{ratio:.2f} "
        f"(target ≤ {TARGET_RATIO})"
    )
    console.print(
        f"time to TRL's final accuracy ({target:.1%}): "
        + ", ".join(
            f"{side} {'not reached' if seconds is None else f'{seconds:.1f} s'}" for side, seconds in reached.items()
        )
        + (f" — ×{time_ratio:.2f}" if time_ratio is not None else "")
        + f" (target ≤ {TARGET_TIME_TO_ACCURACY})"
    )
    console.print(
        f"ahead of TRL at every checkpoint, and the paired interval at step {checkpoints[-1]} above zero: "
        f"{'yes' if ahead else 'no'}"
    )
    sampling = {
        side: {key: statistics.mean(r["sampling"][key] for r in results[side]) for key in results[side][0]["sampling"]}
        for side in results
        if side != "trl"
    }
    for side, drawn in sampling.items():
        console.print(
            f"{side}: {drawn['per_kept_group']:.2f} rollouts sampled per kept group, {drawn['per_step']:.0f} "
            f"per optimizer step, {drawn['rounds_per_step']:.2f} generation rounds a step (TRL samples "
            f"{mirrored['rollouts_per_step']} a step and trains on all of them); "
            f"{drawn['distinct_problems_drawn']:.0f} of {drawn['bank_problems']:.0f} training problems drawn, "
            f"{drawn['revisited']:.0f} revisits, {drawn['retired_at_end']:.0f} retired and "
            f"{drawn['predicted_uniform_at_end']:.0f} predicted uniform after the last step"
        )
    against_fixed = arm_against_arm(results["ours"], results["fixed"], checkpoints) if "fixed" in results else None
    if against_fixed:
        last = against_fixed["paired_difference"][str(checkpoints[-1])]
        console.print(
            f"ours against the fixed arm: ×{against_fixed['per_kept_group_ratio']:.2f} rollouts per kept group "
            f"(target ≤ {TARGET_PER_KEPT_GROUP}); held-out difference at step {checkpoints[-1]}: "
            f"{last['mean']:+.1%} ± {last['half_width']:.1%}"
        )
    intact = all(r["lake_intact"] for side in results if side != "trl" for r in results[side])
    console.print(
        f"every sampled rollout in the lake with its reward, one version per step: {'yes' if intact else 'no'}"
    )
    return {
        "warmup_solve_rate": start,
        "seeds": seeds,
        "steps": steps,
        "checkpoints": checkpoints,
        "accuracy": {
            str(step): {side: {"mean": m, "half_width": h} for side, (m, h) in sides.items()}
            for step, sides in accuracy.items()
        },
        "paired_difference": {str(step): {"mean": m, "half_width": h} for step, (m, h) in paired.items()},
        "wall": wall,
        "ratio": ratio,
        "time_to_accuracy": reached,
        "time_to_accuracy_ratio": time_ratio,
        "target_accuracy": target,
        "ahead_everywhere": ahead,
        "sampling": sampling,
        "against_fixed": against_fixed,
        "lake_intact": intact,
        "trl_settings": {
            **layouts["fastest"],
            "sweep": layouts["layouts"],
            "mirrored": {name: [str(o), str(t)] for name, o, t in mirrored["rows"]},
        },
        "stages": {
            stage: statistics.mean(r["stages"].get(stage, 0.0) for r in results["ours"])
            for stage in results["ours"][0]["stages"]
        },
        "outside": statistics.mean(r["outside"] for r in results["ours"]),
        "runs": results,
    }
