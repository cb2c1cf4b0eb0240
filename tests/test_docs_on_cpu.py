"""README.md and docs/ say what the tree is: every relative link resolves (a heading anchor included), and every
README block marked `<!-- runnable -->` runs with the installed `verl-search` and exits 0.

The runnable blocks are the cheap ones (`--version`, `--help`, an index build over the shipped corpus); the main
job and the test command are run exactly as written by `.ci/readme_commands.sh`.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
RUNNABLE = re.compile(r"<!-- runnable -->\s*```(?:bash|sh)\n(.*?)\n```", re.S)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_anchor(line.lstrip("#")) for line in page.read_text(encoding="utf-8").splitlines()
            if line.startswith("#")}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path):
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path) if path else page
        if not resolved.exists():
            broken.append(f"{target} (no {resolved})")
        elif fragment and resolved.suffix == ".md" and fragment not in _anchors(resolved):
            broken.append(f"{target} (no heading #{fragment} in {resolved.name})")
    assert not broken, f"{page.name}: broken links: {broken}"


def test_readme_has_runnable_blocks_and_the_two_commands():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert RUNNABLE.findall(text)
    for marker in ("<!-- command: main-job -->", "<!-- command: tests -->"):
        assert text.count(marker) == 1, marker


@pytest.mark.parametrize("block", RUNNABLE.findall((REPO / "README.md").read_text(encoding="utf-8")))
def test_runnable_readme_block_runs(block: str, tmp_path: Path):
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, f"README block failed:\n{block}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
