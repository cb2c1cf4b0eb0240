"""ReSearch's validation set: `--max-per-source 100 --seed 42 --sample shuffled` keeps the 100 MuSiQue dev
questions ReSearch's `data/prepare_musique.py` (Agent-RL/ReSearch, branch `re-search`) keeps."""

import json
import random

import pandas as pd
import pytest

from verl_search.datasets.preprocess import PreprocessOptions, preprocess, sample_per_source


def prepare_musique_dev(lines: list[dict]) -> list[dict]:
    """ReSearch's `data/prepare_musique.py`, its dev half: `random.seed(42)` at import, then
    `random.shuffle(lines)` and `lines[:100]` (the same calls, on a private generator)."""
    state = random.getstate()
    try:
        random.seed(42)
        lines = list(lines)
        random.shuffle(lines)
        return lines[:100]
    finally:
        random.setstate(state)


def test_shuffled_sample_is_researchs_validation_set(tmp_path):
    dev = [{"id": f"2hop__{i}", "question": f"question {i}?", "golden_answers": [f"answer {i}"]} for i in range(2417)]
    path = tmp_path / "musique" / "dev.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(row) + "\n" for row in dev))
    out = tmp_path / "test.parquet"
    assert preprocess(PreprocessOptions(inputs=[f"musique={path}"], out=str(out), split="test", protocol="research",
                                        max_per_source=100, seed=42, sample="shuffled")) == 100
    ours = [info["id"] for info in pd.read_parquet(out)["extra_info"]]
    assert ours == [row["id"] for row in prepare_musique_dev(dev)]
    # the default sample is another 100 (the difference docs/training.md used to leave unnamed)
    assert sample_per_source(dev, "musique", 100, seed=42) != prepare_musique_dev(dev)


def test_unknown_sample_method_is_named():
    with pytest.raises(ValueError, match="sample method 'first' is not one of random, shuffled"):
        sample_per_source([1, 2, 3], "nq", 2, method="first")
