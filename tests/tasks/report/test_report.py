"""`rlvr report`: the HTML report and its PNGs over a lake that ran the loop, the data behind the plots,
plots skipped for want of data, and the command line."""

import base64
import shutil
import struct

import polars as pl
import pytest
from conftest import run_cli
from polars.testing import assert_frame_equal

from tasks.report import data
from tasks.report.plots import PLOTS

SELF_PLAY = {"self_play_health"}  # drawn on self-play lakes: tests/tasks/selfplay/test_selfplay_loop.py
LOOP_PLOTS = [plot for plot in PLOTS if plot.name not in SELF_PLAY]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def looped_lake(tmp_path_factory, prefect_api):
    from helpers import RUN, curated_with_eval

    from flows.loop import rl_loop
    from flows.verification import verify_iteration
    from storage.lake import Lake

    lake_uri = str(tmp_path_factory.mktemp("report") / "lake")
    curated_with_eval(lake_uri)
    evaluation = {**RUN.get("evaluation", {}), "k": 2}  # pass@2 beside pass@1
    rl_loop({**RUN, "evaluation": evaluation, "loop": {"iterations": 2, "evaluate_every": 1}}, lake_uri=lake_uri)
    verify_iteration(1, {"workers": 0, "verifier": "flipped"}, lake_uri)  # a later re-score of iteration 1
    return Lake.open(lake_uri)


def png_size(content: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    assert content[:8] == PNG_MAGIC and content[12:16] == b"IHDR"
    return struct.unpack(">II", content[16:24])


def test_the_flow_writes_an_html_report_that_embeds_every_plot(looped_lake, tmp_path, prefect_api):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.report import report

    result = report(str(tmp_path / "out"), looped_lake.uri)
    html = (tmp_path / "out" / "report.html").read_text()
    assert result["html"] == str(tmp_path / "out" / "report.html") and set(result["skipped"]) == SELF_PLAY
    for plot in LOOP_PLOTS:
        content = (tmp_path / "out" / f"{plot.name}.png").read_bytes()
        width, height = png_size(content)
        assert 400 <= width <= 2000 and 300 <= height <= 1500, plot.name
        assert f'id="{plot.name}"' in html and plot.title in html
        assert base64.b64encode(content).decode() in html, f"{plot.name}.png is not embedded"
    assert png_size((tmp_path / "out" / "overview.png").read_bytes())[0] > 1000
    assert "latest held-out solve rate" in html and "Skipped: no self-play proposals" in html
    runs = looped_lake.read("runs").filter(pl.col("flow") == "report")
    assert runs.select("stage", "status").rows() == [("report", "completed")]
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["rlvr-report"])))
    assert any("report.html" in artifact.data for artifact in artifacts)


def test_the_solve_rate_per_level_plot_draws_the_evaluations_numbers(looped_lake):
    from storage.catalog import open_catalog

    result = data.gather(open_catalog(looped_lake))["eval_solve_rate_by_level"]
    expected = (
        looped_lake.read("evaluations")
        .group_by("model_version", "level")
        .agg(pl.col("problems").sum(), solve_rate=pl.col("solved").sum() / pl.col("samples").sum())
        .sort("model_version", "level")
    )
    assert_frame_equal(result.select(expected.columns), expected, check_dtypes=False)
    assert result["model_version"].unique().to_list() == [1, 2]  # evaluated after each iteration


def test_distributions_use_the_verifier_that_scored_the_iteration_first(looped_lake):
    from storage.catalog import open_catalog

    frames = data.gather(open_catalog(looped_lake))
    rollouts = looped_lake.read("rollouts", columns=["iteration"])
    assert frames["rewards"].group_by("iteration", "verifier").len().sort("iteration").rows() == [
        (i, "random", rollouts.filter(pl.col("iteration") == i).height) for i in (1, 2)
    ]  # not the later `flipped`
    assert frames["response_lengths"].height == rollouts.height


@pytest.mark.parametrize(
    "iterations, expected",
    [
        ([], []),
        ([4], [4]),
        ([2, 1], [1, 2]),
        ([1, 2, 3, 4], [1, 3, 4]),
        (list(range(1, 11)), [1, 5, 10]),
        ([3, 3, 7], [3, 7]),
    ],
)
def test_distribution_iterations_span_the_run(iterations, expected):
    assert data.pick_iterations(iterations) == expected


def test_a_lake_without_evaluations_still_reports_and_says_why_a_plot_is_missing(looped_lake, tmp_path):
    from storage.lake import Lake
    from tasks.report.stage import build_report, write_report

    copy = tmp_path / "lake"
    shutil.copytree(looped_lake.uri, copy)
    shutil.rmtree(copy / "evaluations")
    out = tmp_path / "out"
    out.mkdir()
    (out / "eval_solve_rate_by_level.png").write_bytes(b"from an earlier report")
    lake = Lake.open(str(copy))
    result = write_report(build_report(lake, lake.runs_version()), out)
    assert sorted(result["skipped"]) == ["eval_pass_at_k", "eval_solve_rate_by_level", *SELF_PLAY]
    assert not (out / "eval_solve_rate_by_level.png").exists()
    assert set(result["plots"]) == {plot.name for plot in LOOP_PLOTS} - {"eval_solve_rate_by_level", "eval_pass_at_k"}
    html = (out / "report.html").read_text()
    assert "Skipped: no evaluations yet" in html and "Held-out solve rate per level" in html


def test_the_same_lake_version_gives_byte_identical_files(looped_lake):
    from tasks.report.stage import build_report

    version = looped_lake.runs_version()
    first, second = build_report(looped_lake, version), build_report(looped_lake, version)
    assert first.html == second.html and first.overview == second.overview


def test_rlvr_report_in_a_fresh_process(looped_lake, tmp_path):
    out = tmp_path / "report"
    result = run_cli("report", "--out", str(out), "--lake", looped_lake.uri)
    assert result.returncode == 0, result.stderr
    assert str(out / "report.html") in result.stdout and str(out / "filter_rates.png") in result.stdout
    assert all(png_size((out / f"{plot.name}.png").read_bytes()) for plot in LOOP_PLOTS)


def test_an_empty_lake_is_a_one_line_error(tmp_path):
    from storage.lake import Lake
    from tasks.report.stage import require_rollouts

    with pytest.raises(ValueError, match="has no rollouts"):
        require_rollouts(Lake.open(str(tmp_path / "lake")))
    result = run_cli("report", "--out", str(tmp_path / "report"), "--lake", str(tmp_path / "lake"))
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0 and "has no rollouts: run `rlvr run`" in result.stderr
    assert not (tmp_path / "report").exists() and not (tmp_path / "lake").exists()


def test_html_tables_format_rates_counts_and_duckdb_decimals():
    from decimal import Decimal

    from tasks.report.html import frame_table

    table = frame_table(
        pl.DataFrame(
            {
                "model_version": [11],
                "problems": [Decimal(500)],
                "solve_rate": [0.4537],
                "mean_tokens": [29.51],
                "split": ["<eval>"],
            }
        )
    )
    assert '<td class="number">500</td>' in table and '<td class="number">45.4%</td>' in table
    assert '<td class="number">29.51</td>' in table and "<td>&lt;eval&gt;</td>" in table


def test_the_pass_at_k_plot_draws_the_evaluations_numbers(looped_lake):
    from storage.catalog import open_catalog
    from tasks.evaluation import pass_at_k

    frame = data.gather(open_catalog(looped_lake))["eval_pass_at_k"]
    assert frame.height >= 2 and set(frame["k"]) == {2}
    responses = looped_lake.read("eval_rollouts").filter(pl.col("model_version") == frame["model_version"][-1])
    per_problem = responses.group_by("problem_id").agg(n=pl.len(), c=pl.col("correct").fill_null(False).sum())
    expected = sum(pass_at_k(n, c, 2) for n, c in per_problem.select("n", "c").rows()) / per_problem.height
    assert frame["pass_at_k"][-1] == pytest.approx(expected)
    assert frame["pass_at_1"][-1] == pytest.approx(float(responses["correct"].fill_null(False).mean()))


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Appended to a copy of the report: after load, what the browser itself made of every image and table.
RENDER_CHECK = """<script>
window.addEventListener("load", () => {
  const images = [...document.images], tables = [...document.querySelectorAll("table")];
  const result = {images: images.length, tables: tables.length,
    broken: images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt),
    shown_small: images.filter(i => i.getBoundingClientRect().width < 200).map(i => i.alt),
    empty_tables: tables.filter(t => t.rows.length < 1 || t.getBoundingClientRect().height < 10).length};
  const out = document.createElement("pre");
  out.id = "render-check";
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
});
</script>"""


def headless(*args: str, timeout: int = 120):
    import subprocess

    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium (Debian's `chromium`; .ci/run installs it)")
def test_the_report_renders_in_a_browser(looped_lake, tmp_path):
    """The HTML report opened as a person would, in headless Chromium: every plot decodes and shows at
    size, every table has rows, and a screenshot of the page is not blank (many colours, something drawn on most of its height)."""
    import html
    import json
    import re

    import numpy as np
    from PIL import Image

    from tasks.report.stage import build_report, write_report

    write_report(build_report(looped_lake), tmp_path / "out")
    checked = tmp_path / "checked.html"
    checked.write_text((tmp_path / "out" / "report.html").read_text().replace("</body>", RENDER_CHECK + "</body>"))
    dom = headless("--virtual-time-budget=10000", "--dump-dom", checked.as_uri())
    found = re.search(r'<pre id="render-check">(.*?)</pre>', dom.stdout, re.S)
    assert found, dom.stderr[-2000:]
    result = json.loads(html.unescape(found.group(1)))
    assert result["images"] == len(LOOP_PLOTS) and result["broken"] == [] and result["shown_small"] == []
    assert result["tables"] >= 2 and result["empty_tables"] == 0

    screenshot = tmp_path / "report.png"
    shot = headless(
        "--window-size=1280,2400", f"--screenshot={screenshot}", (tmp_path / "out" / "report.html").as_uri()
    )
    assert screenshot.exists(), shot.stderr[-2000:]
    pixels = np.asarray(Image.open(screenshot).convert("RGB"))
    assert pixels.shape[:2] == (2400, 1280)
    colours = len(np.unique(pixels.reshape(-1, 3), axis=0))
    assert colours > 50, f"a near-blank page: {colours} colours"
    drawn_rows = (pixels < 245).any(axis=2).any(axis=1).mean()  # text, tables and plots down the page
    assert drawn_rows > 0.4, f"only {drawn_rows:.0%} of the page's pixel rows hold anything"
