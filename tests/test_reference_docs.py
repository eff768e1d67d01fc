"""The generated reference pages (docs/cli.md, docs/config.md) match the code: a command, option or config
field added without regenerating them (`python -m flows.reference`) fails here."""

from flows.reference import DOCS, PAGES


def test_generated_reference_pages_are_current():
    stale = [
        name
        for name, build in PAGES.items()
        if not (DOCS / name).exists() or (DOCS / name).read_text(encoding="utf-8") != build()
    ]
    assert not stale, f"regenerate {stale} with `python -m flows.reference`"


def test_the_pages_cover_every_command_and_section():
    cli, config = (DOCS / "cli.md").read_text(), (DOCS / "config.md").read_text()
    for command in ("## `rlvr run`", "## `rlvr bench sandbox`", "## `rlvr lineage problem`", "## `rlvr verify-file`"):
        assert command in cli
    for section in (
        "## `rollout.tools`",
        "## `rollout.sampler`",
        "## `train`",
        "## `bank`",
        "## `bank.sources[]`",
        "## `loop`",
    ):
        assert section in config
    assert "| `--files` | flag |" in cli and "| `max_tool_calls` | int | `2` |" in config
    assert "| `--format` | table \\| csv \\| json | `table` |" in cli  # an Enum's choices, as typed
    shipped = sorted(path.name for path in (DOCS.parent / "configs").glob("*.yaml"))
    assert shipped and all(f"| `configs/{name}` |" in config for name in shipped)


def test_every_rule_between_fields_is_written_out():
    """A validator added without a docstring would leave its rule out of the config reference."""
    from flows.reference import config_sections, validator_rules
    from flows.run_config import RunConfig

    unwritten = [
        f"{path} ({model.__name__})"
        for path, model in [("(run)", RunConfig), *config_sections()]
        if None in validator_rules(model)
    ]
    assert not unwritten, f"validators without a docstring: {unwritten}"
    config = (DOCS / "config.md").read_text()
    assert "`loop.max_staleness` ≤ `advantages.max_stale_versions`" in config  # across sections
    assert "a procedural source (generator, gym) takes one `level`" in config  # within bank.sources[]
