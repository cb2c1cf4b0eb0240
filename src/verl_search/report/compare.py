"""Paired comparison of two models on the same questions: the mean difference with a percentile bootstrap
interval, and an exact sign test (the quickstart's report, the learning run; Efron and Tibshirani, "An
Introduction to the Bootstrap", 1993, ch. 13 for the percentile interval). Standard library only.
"""

from __future__ import annotations

import random


def paired_bootstrap(before: list[float], after: list[float], samples: int = 10000, seed: int = 0) -> dict:
    """Mean of `after - before` over paired questions, with a 95% percentile bootstrap interval
    (questions resampled with replacement, `samples` times, `random.Random(seed)`).

    Returns `{"n", "mean_diff", "ci95": [low, high], "better", "worse", "sign_p"}` (`better`/`worse`: pairs
    where `after` is above/below `before`; `sign_p`: `sign_test` of those counts).

    Raises:
        ValueError: the lists differ in length or are empty.

    >>> paired_bootstrap([0, 0, 0, 0], [1, 1, 1, 1])["ci95"]
    [1.0, 1.0]
    """
    if len(before) != len(after) or not before:
        raise ValueError(f"paired_bootstrap needs two equally long non-empty lists, got {len(before)} and {len(after)}")
    diffs = [b - a for a, b in zip(before, after)]
    n = len(diffs)
    rng = random.Random(seed)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(samples))
    low, high = means[int(0.025 * (samples - 1))], means[int(round(0.975 * (samples - 1)))]
    better, worse = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    return {"n": n, "mean_diff": sum(diffs) / n, "ci95": [low, high], "better": better, "worse": worse,
            "sign_p": sign_test(better, worse)}


def sign_test(better: int, worse: int) -> float:
    """Exact two-sided sign test: the probability, with ties left out and each changed pair equally likely to go
    either way, of a split at least as uneven as `better` : `worse`.

    >>> round(sign_test(3, 0), 3), sign_test(0, 0)
    (0.25, 1.0)
    """
    from math import comb

    n, k = better + worse, min(better, worse)
    return min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0


def paired(records_a: list[dict], records_b: list[dict], key: str, samples: int, seed: int,
           only: set[str] | None = None) -> dict:
    """`paired_bootstrap` of `key` over the question ids both record lists hold (and `only` holds, when given:
    a fixed subset of questions, e.g. those whose gold the start model saw).

    Raises:
        ValueError: they share no question (in `only`).
    """
    a = {r["id"]: float(r[key]) for r in records_a}
    b = {r["id"]: float(r[key]) for r in records_b}
    common = a.keys() & b.keys()
    ids = sorted(common if only is None else common & only)
    if not ids:
        raise ValueError(f"no question in common to compare {key!r} on")
    return paired_bootstrap([a[i] for i in ids], [b[i] for i in ids], samples, seed)
