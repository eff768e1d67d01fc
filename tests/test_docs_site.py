"""The documentation site builds with no broken link or anchor (`mkdocs build --strict`), and the README stays
a short front page whose links all resolve."""

import re
import subprocess
import sys

from conftest import ROOT


def test_the_site_builds_strictly(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)},
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    pages = sorted(path.stem for path in (ROOT / "docs").glob("*.md"))
    for page in pages:  # each page in the nav became a page of the site
        assert (tmp_path / "site" / ("" if page == "index" else page) / "index.html").exists(), page
    assert (tmp_path / "site" / "report-example.png").exists()
    config = (tmp_path / "site" / "config" / "index.html").read_text()
    assert "Rules across sections" in config


def test_the_readme_is_short_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for command in ("make demo", "make test", "rlvr sql", "rlvr lineage", "rlvr report", "prefect server start"):
        assert command in readme, command
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [target for target in targets if not target.startswith(("http://", "https://"))]
    assert local and all((ROOT / target).exists() for target in local), [t for t in local if not (ROOT / t).exists()]
