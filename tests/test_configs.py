"""Every YAML file under configs/ loads into its typed config; bad configs name the file and field."""

from pathlib import Path

import pytest
from conftest import ROOT

from flows.run_config import LoopConfig
from policy.publish import PublishConfig
from storage.config import load_yaml_config
from tasks.advantages.stage import AdvantageConfig
from tasks.curation.config import CurationConfig, parse_source_spec
from tasks.curriculum.stage import CurriculumConfig
from tasks.evaluation import EvalConfig
from tasks.interop.tracking import TrackingConfig
from tasks.rewards.compose import RewardConfig
from tasks.rise import SelfVerifyConfig
from tasks.rollout.stage import RolloutConfig
from tasks.sampling.rounds import DynamicSamplingConfig
from tasks.selfplay.stage import SelfPlayConfig
from tasks.verification.stage import VerifyConfig
from trainers.grpo import TrainConfig
from trainers.warmup import WarmupConfig

SECTIONS = {
    "bank": CurationConfig,
    "verify": VerifyConfig,
    "rollout": RolloutConfig,
    "reward": RewardConfig,
    "dynamic_sampling": DynamicSamplingConfig,
    "advantages": AdvantageConfig,
    "train": TrainConfig,
    "evaluation": EvalConfig,
    "loop": LoopConfig,
    "warmup": WarmupConfig,
    "curriculum": CurriculumConfig,
    "publish": PublishConfig,
    "selfplay": SelfPlayConfig,
    "selfverify": SelfVerifyConfig,
    "tracking": TrackingConfig,
}  # not a run config's: `rlvr track --config` (configs/tracking.yaml)
WHOLE_FILE_CONFIGS = {"deployments.yaml"}  # not run configs: validated by test_deployments_config_loads
CONFIGS = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if p.name not in WHOLE_FILE_CONFIGS)


def test_deployments_config_loads():
    from flows.deployments import flow_parameters, load_serve_config

    serve, run_config = load_serve_config(ROOT / "configs" / "deployments.yaml")
    assert run_config and {d.flow for d in serve.deployments} == {
        "curate",
        "loop",
        "iteration",
        "evaluate",
        "rescore",
        "report",
        "audit",
        "sampler",
        "trainer",
        "maintenance",
    }
    parameters = {spec.flow: flow_parameters(spec, serve, run_config) for spec in serve.deployments}
    assert all("lake_uri" in built for built in parameters.values())
    assert parameters["evaluate"]["force"] is False  # hourly, skipped while the evaluation stands
    assert parameters["rescore"]["config"] == {"verify": {}}  # iterations keep their recorded settings
    assert parameters["audit"]["audit_file"] == "audits/math.jsonl"
    from storage.maintenance import MaintenanceConfig

    assert MaintenanceConfig.model_validate(parameters["maintenance"]["config"]).retention_hours == 168
    from flows.deployments import runner_deployments

    served = {d.flow_name for d in runner_deployments(serve, run_config)}
    assert "rl-loop" in served and not served & {"rollout-producer", "policy-trainer"}  # the roles: workers only


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_config_loads(path):
    import yaml

    from flows.run_config import RunConfig

    assert set(RunConfig.model_fields) <= set(SECTIONS), "a run config section this test does not check"
    data = yaml.safe_load(path.read_text())
    assert set(data) <= set(SECTIONS) | {"base"}, f"unknown sections {set(data) - set(SECTIONS)}"
    for section, model in SECTIONS.items():
        if section in data:
            load_yaml_config(path, model, section=section)


def test_errors_name_file_and_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("bank:\n  sources:\n    - kind: gsm8k\n      count: -3\n")
    with pytest.raises(ValueError) as error:
        load_yaml_config(path, CurationConfig, section="bank")
    message = str(error.value)
    assert str(path) in message and "sources.0.count" in message


def test_unknown_fields_are_refused(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("sources: [{kind: generator}]\ndedupe: {exact: false}\n")
    with pytest.raises(ValueError, match="dedupe"):
        load_yaml_config(path, CurationConfig)


@pytest.mark.parametrize(
    "spec, fields",
    [
        ("gsm8k:data/train.jsonl", {"kind": "gsm8k", "path": "data/train.jsonl", "count": None}),
        ("math:s3://bucket/math.parquet:50", {"kind": "math", "path": "s3://bucket/math.parquet", "count": 50}),
        ("aime:x.jsonl", {"kind": "math", "level": 3}),
        ("gen:level2:1000", {"kind": "generator", "generator": "level2", "count": 1000}),
        ("gym:chain_sum:20", {"kind": "gym", "dataset": "chain_sum", "count": 20}),
    ],
)
def test_source_specs(spec, fields):
    source = parse_source_spec(spec)
    assert {key: getattr(source, key) for key in fields} == fields


def test_bad_source_spec():
    with pytest.raises(ValueError, match="KIND:PATH_OR_NAME"):
        parse_source_spec("nonsense")
    with pytest.raises(ValueError, match="needs a path|Input should be"):
        parse_source_spec("csv:file.csv")


def test_a_variant_merges_over_its_base(tmp_path):
    from trainers.grpo import TrainConfig

    (tmp_path / "base.yaml").write_text("train:\n  learning_rate: 0.001\n  micro_batch_size: 8\n")
    (tmp_path / "variant.yaml").write_text("base: base.yaml\ntrain:\n  micro_batch_size: 4\n")
    merged = load_yaml_config(tmp_path / "variant.yaml", TrainConfig, section="train")
    assert (merged.learning_rate, merged.micro_batch_size) == (0.001, 4)
    from tasks.curation.config import MixConfig

    (tmp_path / "mix.yaml").write_text("mix:\n  level_weights: {1: 1.0}\n  seed: 3\n")
    (tmp_path / "level3.yaml").write_text("base: mix.yaml\nmix:\n  level_weights: {3: 1.0}\n")
    mix = load_yaml_config(tmp_path / "level3.yaml", MixConfig, section="mix")
    assert mix.level_weights == {3: 1.0} and mix.seed == 3  # a weights mapping is replaced, not merged
    (tmp_path / "base.yaml").write_text("base: variant.yaml\n")
    with pytest.raises(ValueError, match="makes a cycle"):
        load_yaml_config(tmp_path / "variant.yaml", TrainConfig, section="train")


def test_rlvr_run_reads_every_section_and_refuses_an_unknown_one(tmp_path):
    """`rlvr run --config`: the reward and self-play sections reach the loop (they were once dropped unseen),
    and a misspelt section is an error naming the file and the section, not silently ignored."""
    from flows.cli.common import run_config

    assert run_config(ROOT / "configs" / "intuitor.yaml").reward.kind == "self_certainty"
    assert run_config(ROOT / "configs" / "self-play.yaml").selfplay.enabled
    assert "format" in run_config(ROOT / "configs" / "judge-mix.yaml").reward.components
    typo = tmp_path / "typo.yaml"
    typo.write_text("base: " + str(ROOT / "configs" / "demo.yaml") + "\nrewards: {kind: self_certainty}\n")
    import typer

    with pytest.raises(typer.Exit) as stopped:
        run_config(typo)
    assert stopped.value.exit_code == 2


DEMO = ROOT / "configs" / "demo.yaml"


@pytest.mark.parametrize(
    "body, line, expected",
    [
        (
            "rollout:\n  group_sise: 8\n",
            3,
            "rollout.group_sise: Extra inputs are not permitted (did you mean group_size?)",
        ),
        (
            "train:\n  micro_batch_size: 4\n  learning_rat: 0.1\n",
            4,
            "train.learning_rat: Extra inputs are not permitted (did you mean learning_rate?)",
        ),
        ("rollout:\n  group_size: eight\n", 3, "rollout.group_size: Input should be a valid integer"),
        ("rollout:\n  group_size: 1\n", 3, "rollout.group_size: Input should be greater than or equal to 2"),
        (
            "loop:\n  mode: async\n  max_staleness: 9\n",
            4,
            "(a rule across fields): Value error, loop.max_staleness 9 exceeds advantages.max_stale_versions",
        ),
    ],
)
def test_a_config_error_names_the_kind_the_line_and_the_closest_field(tmp_path, body, line, expected):
    """Unknown field, wrong type, out of range, a rule across fields: each error says what the file was read as,
    and names the YAML line of the field at fault (for a rule, the first field its message names)."""
    from flows.run_config import load_run_configs

    path = tmp_path / "variant.yaml"
    path.write_text(f"base: {DEMO}\n{body}")
    with pytest.raises(ValueError) as error:
        load_run_configs(path)
    first, *lines = str(error.value).splitlines()
    assert first.startswith(f"{path}: read as a run config (its sections ")
    assert any(text.startswith(f"{path}:{line}: {expected}") for text in lines), lines


def test_a_run_config_is_read_once_on_the_way_to_its_configs_or_its_errors(tmp_path, monkeypatch):
    """`rlvr run` takes the bank and the stage sections out of one file: each file (the variant and its `base:`)
    is read once, and an error's lines come from one more parse of the file at fault, whatever the number of
    errors (it was read for the section check, the stage sections, the bank check, the bank, and once an error)."""
    from flows.run_config import load_run_configs

    reads, original = [], Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: reads.append(self.name) or original(self, *a, **k))
    variant = tmp_path / "variant.yaml"
    variant.write_text(f"base: {DEMO}\nrollout:\n  group_size: 4\n")
    curation, settings = load_run_configs(variant)
    assert settings.rollout.group_size == 4 and curation.sources
    assert sorted(reads) == ["demo.yaml", "variant.yaml"]
    reads.clear()
    wrong = tmp_path / "wrong.yaml"  # two errors in the stage sections, and no bank
    wrong.write_text("rollout:\n  group_sise: 8\ntrain:\n  learning_rat: 0.1\n")
    with pytest.raises(ValueError) as error:
        load_run_configs(wrong)
    assert f"{wrong}:2: rollout.group_sise" in str(error.value) and f"{wrong}:4: train.learning_rat" in str(error.value)
    assert "needs a `bank:` section" in str(error.value)
    assert reads == ["wrong.yaml", "wrong.yaml"]  # its settings, then its lines


def test_a_field_a_base_file_sets_wrong_is_named_at_its_line_there(tmp_path):
    from flows.run_config import load_run_config

    (tmp_path / "base.yaml").write_text("train:\n  micro_batch_size: 4\nrollout:\n  group_sise: 3\n")
    (tmp_path / "variant.yaml").write_text("base: base.yaml\ntrain:\n  micro_batch_size: 8\n")
    with pytest.raises(ValueError) as error:
        load_run_config(tmp_path / "variant.yaml")
    assert f"{tmp_path / 'base.yaml'}:4: rollout.group_sise:" in str(error.value)


def test_a_run_config_without_a_bank_is_said_to_be_one_not_read_as_a_curation_config(cli, tmp_path):
    """Issue 37: a file of only `rollout:` with a typo was reported as `sources: Field required` and `rollout: Extra
    inputs are not permitted` (read as a curation config); the typo was never named."""
    path = tmp_path / "mine.yaml"
    path.write_text("rollout:\n  group_sise: 8\n")
    result = cli("run", "--config", str(path), "--lake", str(tmp_path / "lake"))
    assert result.returncode == 2
    text = " ".join(result.stderr.split())
    assert f"{path}:2: rollout.group_sise: Extra inputs are not permitted (did you mean group_size?)" in text
    assert "a run config (what `rlvr run` reads) needs a `bank:` section" in text and "base: demo.yaml" in text
    assert "sources: Field required" not in text and not (tmp_path / "lake").exists()
    (tmp_path / "curation.yaml").write_text("rollout:\n  group_size: 8\n")  # a stage command says why
    with pytest.raises(
        ValueError,
        match=r"read as a curation config \(the whole file, because it has no `bank:` "
        r"section; its sections are rollout\)",
    ):
        load_yaml_config(tmp_path / "curation.yaml", CurationConfig, section="bank")
