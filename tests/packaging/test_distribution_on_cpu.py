"""What users install: the wheel and sdist carry the whole package, and the import comes from them.

CI (`.ci/run`) builds the sdist and, from it, the wheel, installs the wheel into a fresh venv and
runs this suite there with `VERL_SEARCH_WHEEL` / `VERL_SEARCH_SDIST` pointing at the built files and
`VERL_SEARCH_TEST_INSTALLED=1`. Run locally, the wheel and sdist are built here (no build isolation).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import verl_search
from tests.conftest import REPO

SOURCE = REPO / "src" / "verl_search"
SHIPPED_SUFFIXES = {".py", ".yaml", ".gz"}  # .gz: the mini-wiki dataset
#: the tool YAMLs of the top-level tool_configs/, shipped through links in verl_search/configs/
TOOL_CONFIGS = ("search_tool_config.yaml", "access_tool_config.yaml")


def _package_files() -> set[str]:
    """Paths (relative to the package's parent, e.g. `verl_search/tools/client.py`) the source tree holds."""
    return {str(path.relative_to(SOURCE.parent)) for path in SOURCE.rglob("*")
            if path.suffix in SHIPPED_SUFFIXES and "__pycache__" not in path.parts}


def _built(kind: str, tmp_path_factory) -> Path:
    given = os.environ.get(f"VERL_SEARCH_{kind.upper()}")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp(kind)
    flag = "--wheel" if kind == "wheel" else "--sdist"
    subprocess.run([sys.executable, "-m", "build", flag, "--no-isolation", "--outdir", str(out), str(REPO)],
                   check=True, capture_output=True)
    return next(out.iterdir())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return _built("wheel", tmp_path_factory)


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    return _built("sdist", tmp_path_factory)


def test_every_folder_is_a_package():
    # find_packages skips a folder without __init__.py: the wheel would silently lack it
    missing = [str(d.relative_to(REPO)) for d in SOURCE.rglob("*")
               if d.is_dir() and d.name != "__pycache__" and not (d / "__init__.py").is_file()]
    assert not missing, f"folders without __init__.py (left out of the wheel): {missing}"


def test_wheel_holds_every_package_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_package_files() - names)
    assert not missing, f"{wheel.name} lacks {missing}"
    assert "verl_search/configs/search_tool_config.yaml" in names
    assert "verl_search/configs/agent_loops.yaml" in names
    assert {"verl_search/datasets/mini_wiki/corpus.jsonl.gz", "verl_search/datasets/mini_wiki/qa.jsonl.gz",
            "verl_search/datasets/mini_wiki/README.md"} <= names  # the data and its licences
    # the quickstart's GRPO recipe: in the source a link to the example recipe, in the wheel its content
    recipe = zipfile.ZipFile(wheel).read("verl_search/configs/grpo_qwen2.5-3b-base_search_r1.yaml")
    assert recipe == (REPO / "examples" / "grpo_qwen2.5-3b-base_search_r1" / "config.yaml").read_bytes()
    # the tool YAMLs: in the source links to the top-level tool_configs/, in the wheel their content
    for name in TOOL_CONFIGS:
        assert zipfile.ZipFile(wheel).read(f"verl_search/configs/{name}") == (REPO / "tool_configs" / name).read_bytes()
    # the kept runs and the documentation stay in the repository
    assert not [n for n in names if n.startswith(("results/", "docs/", "tests/"))]
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "verl-search = verl_search.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_sdist_holds_every_package_file(sdist):
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    missing = sorted(f"src/{name}" for name in _package_files() if f"src/{name}" not in names)
    assert not missing, f"{sdist.name} lacks {missing}"
    assert {"setup.py", "pyproject.toml", "README.md"} <= names
    with tarfile.open(sdist) as archive:
        recipe = next(m for m in archive.getmembers() if m.name.endswith("configs/grpo_qwen2.5-3b-base_search_r1.yaml"))
        assert recipe.isfile(), "the sdist holds the quickstart's recipe as a link, not a file"
        assert archive.extractfile(recipe).read() == (REPO / "examples" / "grpo_qwen2.5-3b-base_search_r1" /
                                                      "config.yaml").read_bytes()
        for name in TOOL_CONFIGS:
            member = next(m for m in archive.getmembers() if m.name.endswith(f"src/verl_search/configs/{name}"))
            assert member.isfile() and archive.extractfile(member).read() == (REPO / "tool_configs" / name).read_bytes()
    assert not [n for n in names if n.startswith(("results/", "docs/runs/"))], "the sdist carries the kept runs"


def test_version_is_the_distribution_version():
    from importlib import metadata

    assert verl_search.__version__ == metadata.version("verl-search")
    out = subprocess.run([sys.executable, "-m", "verl_search.cli", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"verl-search {verl_search.__version__}"


@pytest.mark.skipif(os.environ.get("VERL_SEARCH_TEST_INSTALLED") != "1", reason="CI sets it: tests run on the installed wheel")
def test_package_is_imported_from_the_installed_wheel():
    # an editable install or the source tree on sys.path would hide a file missing from the wheel
    path = Path(verl_search.__file__).resolve()
    assert "site-packages" in path.parts, f"verl_search was imported from {path}, not from the installed wheel"
    assert not path.is_relative_to(REPO), path
