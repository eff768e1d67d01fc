"""Every YAML file under configs/ loads into its typed config; bad configs name the file and field."""

from pathlib import Path

import pytest

from conftest import ROOT
from tasks.config import load_yaml_config
from tasks.curation.config import CurationConfig, parse_source_spec
from tasks.advantages.dynamic_sampling import DynamicSamplingConfig
from tasks.advantages.stage import AdvantageConfig
from tasks.rollout.stage import RolloutConfig
from tasks.verification import VerifyConfig
from trainers.grpo import TrainConfig
from flows.run_config import LoopConfig
from tasks.evaluation import EvalConfig
from trainers.warmup import WarmupConfig
from tasks.curriculum.stage import CurriculumConfig

from tasks.rewards.compose import RewardConfig
from tasks.rollout.publish import PublishConfig
from tasks.selfplay.self_verify import SelfVerifyConfig
from tasks.selfplay.stage import SelfPlayConfig

SECTIONS = {"bank": CurationConfig, "verify": VerifyConfig, "rollout": RolloutConfig, "reward": RewardConfig,
            "dynamic_sampling": DynamicSamplingConfig, "advantages": AdvantageConfig, "train": TrainConfig, "evaluation": EvalConfig,
            "loop": LoopConfig, "warmup": WarmupConfig,
            "curriculum": CurriculumConfig, "publish": PublishConfig, "selfplay": SelfPlayConfig,
            "selfverify": SelfVerifyConfig}
WHOLE_FILE_CONFIGS = {"deployments.yaml"}              # not run configs: validated by test_deployments_config_loads
CONFIGS = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if p.name not in WHOLE_FILE_CONFIGS)


def test_deployments_config_loads():
    from flows.deployments import flow_parameters, load_serve_config

    serve, run_config = load_serve_config(ROOT / "configs" / "deployments.yaml")
    assert run_config and {d.flow for d in serve.deployments} == {"curate", "loop", "iteration", "evaluate",
                                                                   "rescore", "report", "audit", "sampler",
                                                                   "trainer"}
    parameters = {spec.flow: flow_parameters(spec, serve, run_config) for spec in serve.deployments}
    assert all("lake_uri" in built for built in parameters.values())
    assert parameters["evaluate"]["force"] is False                  # hourly, skipped while the evaluation stands
    assert parameters["rescore"]["config"] == {"verify": {}}         # iterations keep their recorded settings
    assert parameters["audit"]["audit_file"] == "audits/math.jsonl"
    from flows.deployments import runner_deployments

    served = {d.flow_name for d in runner_deployments(serve, run_config)}
    assert "rl-loop" in served and not served & {"rollout-producer", "policy-trainer"}   # the roles: workers only


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


@pytest.mark.parametrize("spec, fields", [
    ("gsm8k:data/train.jsonl", {"kind": "gsm8k", "path": "data/train.jsonl", "count": None}),
    ("math:s3://bucket/math.parquet:50", {"kind": "math", "path": "s3://bucket/math.parquet", "count": 50}),
    ("aime:x.jsonl", {"kind": "math", "level": 3}),
    ("gen:level2:1000", {"kind": "generator", "generator": "level2", "count": 1000}),
    ("gym:chain_sum:20", {"kind": "gym", "dataset": "chain_sum", "count": 20}),
])
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
    assert mix.level_weights == {3: 1.0} and mix.seed == 3           # a weights mapping is replaced, not merged
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
