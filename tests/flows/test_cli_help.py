"""The command line as a user first meets it: `--version`, and help that shows flags as flags."""

from conftest import run_cli


def test_version_and_flags_without_a_type():
    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("rlvr ")
    for command in (["--help"], ["bench", "sandbox", "--help"], ["bank", "sample", "--help"]):
        shown = run_cli(*command)
        assert shown.returncode == 0, shown.stderr
        assert "<bool>" not in shown.stdout, command
        assert "--help" in shown.stdout
    assert "<int range>" in run_cli("bank", "sample", "--help").stdout  # options that take values keep theirs
    assert "--install-completion" in run_cli("--help").stdout  # shell completion


def test_piped_tables_keep_every_column(tmp_path):
    import os
    import subprocess

    from conftest import BIN, ROOT

    names = [f"column_number_{i}_with_a_long_name" for i in range(4)]  # ~150 characters of header
    query = "select " + ", ".join(f"{i} as {name}" for i, name in enumerate(names))
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}  # piped, no width given
    shown = subprocess.run(
        [str(BIN / "rlvr"), "sql", query, "--lake", str(tmp_path / "lake")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert all(name in shown.stdout for name in names)
