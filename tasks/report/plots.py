"""The report's figures, built from the frames of `data.py` with matplotlib's object API.

No pyplot: a `Figure` is made, drawn and rendered to PNG bytes without any global state or GUI
backend, so reports can be built in worker threads and tests. Each plot draws onto one `Axes`, so
the same drawing makes its own PNG and its panel of the overview figure. PNGs carry no software or
time stamp: the same lake gives byte-identical files.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator, PercentFormatter

DPI = 100
DISCRETE_REWARDS = 6  # up to this many distinct rewards: one bar per value
OUTCOME_ORDER = ["kept", "all_wrong", "all_correct", "outside_band", "surplus"]
OUTCOME_COLOURS = {
    "kept": "#2ca02c",
    "all_wrong": "#d62728",
    "all_correct": "#1f77b4",
    "outside_band": "#ff7f0e",
    "surplus": "#bbbbbb",
}
SOLVED_COLOURS = {True: "#2ca02c", False: "#d62728", None: "#7f7f7f"}


@dataclass(frozen=True)
class Plot:
    name: str  # file stem of its PNG and anchor in the HTML
    title: str
    caption: str  # what it shows, for the HTML
    data: str  # the frame of `data.gather` it draws
    draw: Callable[[Axes, pl.DataFrame], None]
    missing: str  # why it is skipped when its frame is empty


def _percent_axis(ax: Axes, label: str) -> None:
    ax.set_ylim(-0.02, 1.02)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)


def _by(frame: pl.DataFrame, column: str) -> list[tuple[object, pl.DataFrame]]:
    """(value, rows) per distinct value of `column`, in sorted order."""
    return [(key, part) for (key,), part in frame.sort(column).group_by(column, maintain_order=True)]


def draw_solve_rate_by_level(ax: Axes, frame: pl.DataFrame, ylabel: str) -> None:
    """One line per level: solve rate against the model version."""
    for level, part in _by(frame.sort("model_version"), "level"):
        ax.plot(part["model_version"].to_numpy(), part["solve_rate"].to_numpy(), marker="o", label=f"level {level}")
    ax.set_xlabel("model version")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _percent_axis(ax, ylabel)
    ax.legend(fontsize=8)


def draw_eval_solve_rate(ax: Axes, frame: pl.DataFrame) -> None:
    draw_solve_rate_by_level(ax, frame, "held-out sampled solve rate")


def draw_train_solve_rate(ax: Axes, frame: pl.DataFrame) -> None:
    draw_solve_rate_by_level(ax, frame, "training groups' solve rate")
    ax.set_xlabel("model version that sampled the groups")


def draw_rewards(ax: Axes, frame: pl.DataFrame) -> None:
    """Per iteration, the share of its rollouts at each reward: bars side by side per reward value when the
    verifier gives a few values (pass / fail), else per histogram bin."""
    parts = _by(frame, "iteration")
    labels = [
        f"iteration {iteration}" + (f" ({part['verifier'][0]})" if frame["verifier"].n_unique() > 1 else "")
        for iteration, part in parts
    ]
    levels = frame["reward"].unique().sort().to_list()
    if len(levels) <= DISCRETE_REWARDS:
        width = 0.8 / len(parts)
        for index, ((_, part), label) in enumerate(zip(parts, labels)):
            shares = [(part["reward"] == level).mean() for level in levels]
            ax.bar(np.arange(len(levels)) - 0.4 + width * (index + 0.5), shares, width=width, label=label)
        ax.set_xticks(range(len(levels)), [f"{level:g}" for level in levels])
    else:
        values = [part["reward"].to_numpy() for _, part in parts]
        low, high = min(0.0, levels[0]), max(1.0, levels[-1])
        ax.hist(
            values, bins=np.linspace(low, high, 11), weights=[np.full(len(v), 1 / len(v)) for v in values], label=labels
        )
    ax.set_xlabel("reward")
    _percent_axis(ax, "share of the iteration's rollouts")
    ax.legend(fontsize=8)


def draw_response_lengths(ax: Axes, frame: pl.DataFrame) -> None:
    """Box plots of response tokens per iteration, solved and unsolved side by side."""
    outcomes = [True, False] if frame["solved"].null_count() < frame.height else [None]
    width = 0.8 / len(outcomes)
    parts = _by(frame, "iteration")
    for index, (_, part) in enumerate(parts):
        for offset, solved in enumerate(outcomes):
            chosen = part if solved is None else part.filter(pl.col("solved") == solved)
            if chosen.is_empty():
                continue
            position = index - 0.4 + width * (offset + 0.5)
            ax.boxplot(
                [chosen["n_tokens"].to_numpy()],
                positions=[position],
                widths=width * 0.85,
                patch_artist=True,
                boxprops={"facecolor": SOLVED_COLOURS[solved], "alpha": 0.6},
                medianprops={"color": "black"},
                flierprops={"markersize": 2},
            )
    ax.set_xticks(range(len(parts)), [f"iteration {iteration}" for iteration, _ in parts])
    ax.set_xlim(-0.6, len(parts) - 0.4)
    ax.set_ylabel("response tokens")
    ax.grid(alpha=0.3, axis="y")
    if outcomes != [None]:
        ax.legend(
            handles=[
                Patch(facecolor=SOLVED_COLOURS[s], alpha=0.6, label=("solved" if s else "unsolved")) for s in outcomes
            ],
            fontsize=8,
        )


def draw_learning_zone(ax: Axes, frame: pl.DataFrame) -> None:
    ordered = frame.sort("iteration")
    ax.plot(ordered["iteration"].to_numpy(), ordered["zone_share"].to_numpy(), marker="o", color="#9467bd")
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _percent_axis(ax, "groups with 20-50 % solved")


def draw_filter_rates(ax: Axes, frame: pl.DataFrame) -> None:
    """Stacked shares of what dynamic sampling did with each iteration's groups."""
    shares = frame.pivot(on="outcome", index="iteration", values="share").sort("iteration").fill_null(0.0)
    present = [c for c in shares.columns if c != "iteration"]
    outcomes = [o for o in OUTCOME_ORDER if o in present] + sorted(set(present) - set(OUTCOME_ORDER))
    iterations = shares["iteration"].to_numpy()
    bottom = np.zeros(len(iterations))
    for outcome in outcomes:
        share = shares[outcome].to_numpy()
        ax.bar(iterations, share, bottom=bottom, width=0.8, label=outcome, color=OUTCOME_COLOURS.get(outcome))
        bottom += share
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _percent_axis(ax, "share of drawn groups")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))


def draw_pass_at_k(ax: Axes, frame: pl.DataFrame) -> None:
    """pass@1 and pass@k of each evaluated model version."""
    ordered = frame.sort("model_version")
    versions = ordered["model_version"].to_numpy()
    ax.plot(versions, ordered["pass_at_1"].to_numpy(), marker="o", label="pass@1")
    ks = sorted(set(ordered["k"].to_list()))
    ax.plot(versions, ordered["pass_at_k"].to_numpy(), marker="s", label=f"pass@{ks[0]}" if len(ks) == 1 else "pass@k")
    ax.set_xlabel("model version")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _percent_axis(ax, "held-out problems solved")
    ax.legend(fontsize=8)


def draw_self_play_health(ax: Axes, frame: pl.DataFrame) -> None:
    """Self-play's collapse signals per iteration: how valid, new and varied the proposals are, how hard."""
    ordered = frame.sort("iteration")
    iterations = ordered["iteration"].to_numpy()
    for column, label, colour in (
        ("valid_rate", "valid proposals", "#2ca02c"),
        ("distinct_rate", "new tasks", "#1f77b4"),
        ("near_duplicate_rate", "near-duplicates", "#d62728"),
        ("mean_solve_rate", "solver solve rate", "#9467bd"),
    ):
        ax.plot(iterations, ordered[column].cast(pl.Float64).to_numpy(), marker="o", label=label, color=colour)
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _percent_axis(ax, "share of proposals")
    ax.legend(fontsize=8)


PLOTS = [
    Plot(
        "eval_solve_rate_by_level",
        "Held-out solve rate per level",
        "Sampled solve rate of each evaluated model version on the pinned held-out problems, per level "
        "(view eval_solve_rate_by_level).",
        "eval_solve_rate_by_level",
        draw_eval_solve_rate,
        "no evaluations yet (the loop evaluates every `loop.evaluate_every` iterations)",
    ),
    Plot(
        "eval_pass_at_k",
        "Held-out pass@k",
        "pass@1 and pass@k (the unbiased estimator over n samples per problem) of each model version evaluated "
        "with `evaluation.k` > 1 (view eval_pass_at_k).",
        "eval_pass_at_k",
        draw_pass_at_k,
        "no pass@k evaluations (rlvr evaluate --k 8)",
    ),
    Plot(
        "train_solve_rate_by_level",
        "Training solve rate per level",
        "Mean solve rate of the training groups per level, by the model version that sampled them "
        "(view solve_rate_by_level).",
        "train_solve_rate_by_level",
        draw_train_solve_rate,
        "no training groups yet (run an iteration: `rlvr run` or `rlvr iterate`)",
    ),
    Plot(
        "reward_distribution",
        "Reward distribution",
        "Rewards of the first, a middle and the last iteration, each as shares of its rollouts "
        "(the verifier that scored the iteration first).",
        "rewards",
        draw_rewards,
        "no rewards yet (verify an iteration: `rlvr verify`)",
    ),
    Plot(
        "response_lengths",
        "Response length distribution",
        "Response tokens of the same iterations, solved and unsolved responses side by side "
        "(boxes: quartiles, whiskers: 1.5 IQR).",
        "response_lengths",
        draw_response_lengths,
        "no rollouts with token counts",
    ),
    Plot(
        "learning_zone_share",
        "Learning-zone share",
        "Share of each iteration's drawn groups whose solve rate lies in the 20-50 % learning zone "
        "(view learning_zone_share).",
        "learning_zone_share",
        draw_learning_zone,
        "no groups yet (run the advantage stage: `rlvr advantages`)",
    ),
    Plot(
        "filter_rates",
        "Filter rates",
        "What dynamic sampling did with each iteration's groups: kept, or filtered as all wrong, all correct, "
        "outside the band, or surplus (view filter_stats).",
        "filter_stats",
        draw_filter_rates,
        "no groups yet (run the advantage stage: `rlvr advantages`)",
    ),
    Plot(
        "self_play_health",
        "Self-play health",
        "Per iteration: the share of proposals that are valid, that propose a task never proposed before, valid "
        "tasks that repeat an earlier one's shape, and the solver's mean solve rate on them (view "
        "proposal_health).",
        "proposal_health",
        draw_self_play_health,
        "no self-play proposals (selfplay.enabled)",
    ),
]


def figure(plot: Plot, frame: pl.DataFrame) -> Figure:
    """One plot on its own figure."""
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.add_subplot()
    plot.draw(ax, frame)
    ax.set_title(plot.title)
    return fig


def overview(frames: dict[str, pl.DataFrame], title: str) -> Figure:
    """Every plot as a panel of one figure; a skipped plot's panel says why."""
    columns = -(-len(PLOTS) // 2)
    fig = Figure(figsize=(16 * columns / 3, 8.5), layout="constrained")
    fig.suptitle(title)
    axes = list(fig.subplots(2, columns).flat)
    for ax in axes[len(PLOTS) :]:
        ax.set_axis_off()
    for ax, plot in zip(axes, PLOTS):
        frame = frames[plot.data]
        if frame.is_empty():
            ax.text(0.5, 0.5, textwrap.fill(plot.missing, 40), ha="center", va="center", color="#555555")
            ax.set_axis_off()
        else:
            plot.draw(ax, frame)
        ax.set_title(plot.title)
    return fig


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes, without the software tag (nothing in it depends on when it was made)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()
