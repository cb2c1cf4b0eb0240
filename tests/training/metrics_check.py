"""Test-only: the `search/*` step metrics (`verl_search.training.metrics`) recomputed from the training samples
the agent-loop workers produced (`recorder.py` lines), to compare with what verl logged."""

from __future__ import annotations

import numpy as np

SEARCH_METRICS = {"num_searches/mean", "num_searches/max", "num_searches/min", "searched/mean",
                  "failed_searches/mean", "failed_share", "answered/mean", "em/mean", "f1/mean",
                  "cover_em/mean", "format_ok/mean"}
"""The names (under `search/`) every step logs; the tag protocol adds `valid_turns/share`."""
BATCH_PREFIXES = ("search/groups/", "search/score_before_filter/", "search/control/")
"""`search/` metrics of the step's groups and of the control (`verl_search.training.replay_buffer`), not
recomputed from single trajectories."""


def logged_trajectory_metrics(values: dict[str, float]) -> dict[str, float]:
    """The `search/*` metrics of one logged step that `expected_metrics` recomputes: all but `BATCH_PREFIXES`."""
    return {k: v for k, v in values.items() if k.startswith("search/") and not k.startswith(BATCH_PREFIXES)}


def expected_metrics(records: list[dict], step: int) -> dict[str, float]:
    """The `search/*` values of training step `step`'s samples: counters from their extra fields, reward means
    from our reward's outputs, the share of valid turns and the stale-token shares (weights older than version
    `step - 1`, what the step trains) from the tag protocol's turn records."""
    from verl_search.agent_protocol.vocabulary import parse_action

    fields = [r["extra_fields"] for r in records]
    infos = [f["reward_extra_info"] for f in fields]
    searches = np.array([f.get("num_searches", 0) for f in fields], dtype=float)
    failed = np.array([f.get("failed_searches", 0) for f in fields], dtype=float)
    expected = {
        "num_searches/mean": searches.mean(), "num_searches/max": searches.max(),
        "num_searches/min": searches.min(), "searched/mean": (searches > 0).mean(),
        "failed_searches/mean": failed.mean(), "failed_share": failed.sum() / searches.sum() if searches.sum() else 0,
        "answered/mean": np.mean([i["answered"] for i in infos]), "em/mean": np.mean([i["acc"] for i in infos]),
        "f1/mean": np.mean([i["f1"] for i in infos]), "cover_em/mean": np.mean([i["cover_em"] for i in infos]),
        "format_ok/mean": np.mean([i["format_ok"] for i in infos]),
    }
    turns = [t for f in fields for t in f.get("turns", [])]
    if turns:
        expected["valid_turns/share"] = np.mean([(t.get("action") or parse_action(t["generated"]).kind) != "invalid"
                                                 for t in turns])
    versioned = [t for t in turns if "min_global_steps" in t]
    if versioned:
        tokens = sum(t["generated_tokens"] for t in versioned)
        expected["stale_tokens/share"] = sum(t["generated_tokens"] for t in versioned
                                             if t["max_global_steps"] < step - 1) / tokens
        expected["stale_tokens/share_max"] = sum(t["generated_tokens"] for t in versioned
                                                 if t["min_global_steps"] < step - 1) / tokens
    names = SEARCH_METRICS | ({"valid_turns/share"} if turns else set()) | (
        {"stale_tokens/share", "stale_tokens/share_max"} if versioned else set())
    if set(expected) != names:
        raise AssertionError(f"recomputed {sorted(expected)}, expected the names {sorted(names)}")
    return {f"search/{k}": float(v) for k, v in expected.items()}
