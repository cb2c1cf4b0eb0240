"""`report.compare`: the paired bootstrap and the sign test behind every before/after comparison."""

import random

import pytest

from verl_search.report.compare import paired, paired_bootstrap


def test_bootstrap_of_a_constant_difference_is_that_difference():
    result = paired_bootstrap([0.0] * 20, [1.0] * 20, samples=500)
    assert result["mean_diff"] == 1.0 and result["ci95"] == [1.0, 1.0]
    assert result["better"] == 20 and result["worse"] == 0


def test_bootstrap_interval_covers_zero_when_nothing_changed_and_excludes_it_for_a_real_gain():
    rng = random.Random(1)
    before = [float(rng.random() < 0.3) for _ in range(200)]
    same = paired_bootstrap(before, list(before), samples=2000)
    assert same["ci95"] == [0.0, 0.0]
    shuffled = list(before)
    rng.shuffle(shuffled)  # other questions right, as many of them: no gain on average
    flat = paired_bootstrap(before, shuffled, samples=2000)
    assert flat["mean_diff"] == 0 and flat["ci95"][0] < 0 < flat["ci95"][1]
    gain = [1.0 if rng.random() < 0.4 else b for b in before]  # only ever better
    up = paired_bootstrap(before, gain, samples=2000)
    assert up["ci95"][0] > 0 and up["worse"] == 0


def test_bootstrap_is_seeded_and_pairs_by_question_id():
    a = [float(i % 3 == 0) for i in range(50)]
    b = [float(i % 2 == 0) for i in range(50)]
    assert paired_bootstrap(a, b, 1000, seed=3) == paired_bootstrap(a, b, 1000, seed=3)
    first = [{"id": str(i), "em": a[i]} for i in range(50)]
    second = [{"id": str(i), "em": b[i]} for i in reversed(range(50))]  # other order, same questions
    assert paired(first, second, "em", 1000, 3) == paired_bootstrap(a, b, 1000, seed=3)
    with pytest.raises(ValueError, match="equally long"):
        paired_bootstrap([1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="no question in common"):
        paired(first, [{"id": "x", "em": 1.0}], "em", 10, 0)
