"""pass@k (Chen et al. 2021, arXiv 2107.03374, eq. 1) on hand-written records, and its section of eval's report."""

import json
from itertools import combinations
from math import comb

import pytest

from verl_search.report.pass_at_k import bootstrap_interval, pass_at_k, summarize_pass_at_k


@pytest.mark.parametrize("n, c, k", [(8, 0, 1), (8, 3, 1), (8, 3, 4), (8, 5, 4), (8, 1, 8), (4, 2, 4), (1, 1, 1)])
def test_pass_at_k_is_one_minus_the_share_of_k_subsets_with_no_correct_sample(n, c, k):
    # the definition counted by hand: every k-subset of n samples, c of them correct
    subsets = list(combinations([True] * c + [False] * (n - c), k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


@pytest.mark.parametrize("n, c, k, message", [(0, 0, 1, "n=0"), (4, 5, 1, "c=5"), (4, 1, 5, "k=5 must lie in 1..n=4"),
                                              (4, 1, 0, "k=0")])
def test_bad_counts_name_the_value(n, c, k, message):
    with pytest.raises(ValueError, match=message):
        pass_at_k(n, c, k)


def records(source: str, qid: str, correct: list[int]) -> list[dict]:
    return [{"id": f"{source}/{qid}#{i}", "data_source": source, "question": qid, "golden_answers": ["x"],
             "prediction": "x" if ok else "y", "em": float(ok), "f1": float(ok), "cover_em": float(ok), "score": float(ok),
             "num_searches": 1, "failed_searches": 0, "answered": True, "generated_tokens": 10}
            for i, ok in enumerate(correct)]


RECORDS = (records("nq", "1", [1, 0, 0, 0, 0, 0, 0, 0]) + records("nq", "2", [0] * 8)
           + records("hotpotqa", "3", [1, 1, 0, 1, 0, 0, 0, 0]) + records("hotpotqa", "4", [1] * 8))


def test_summary_per_source_and_all():
    summary = summarize_pass_at_k(RECORDS, bootstrap=200)
    assert list(summary) == ["hotpotqa", "nq", "all"]
    nq = summary["nq"]
    assert nq["questions"] == 2 and nq["samples"] == [8, 8]
    assert nq["pass@1"]["mean"] == pytest.approx((1 / 8 + 0) / 2)
    assert nq["pass@4"]["mean"] == pytest.approx((0.5 + 0) / 2)
    assert nq["pass@8"]["mean"] == pytest.approx(0.5)
    assert summary["all"]["pass@4"]["mean"] == pytest.approx((0.5 + 0 + (1 - comb(5, 4) / comb(8, 4)) + 1) / 4)
    for entry in summary.values():  # pass@k never falls as k grows; the interval holds the mean
        means = [entry[f"pass@{k}"]["mean"] for k in (1, 4, 8)]
        assert means == sorted(means)
        assert all(entry[f"pass@{k}"]["ci95"][0] <= entry[f"pass@{k}"]["mean"] <= entry[f"pass@{k}"]["ci95"][1]
                   for k in (1, 4, 8))


def test_k_above_the_samples_is_left_out():
    summary = summarize_pass_at_k(records("nq", "1", [1, 0, 0]), bootstrap=50)
    assert set(summary["all"]) == {"questions", "samples", "pass@1"}
    assert bootstrap_interval([]) == [0.0, 1.0]


def test_report_json_and_md_carry_pass_at_k(tmp_path):
    from verl_search.report.evaluation import write_report

    write_report(RECORDS, tmp_path, "sampled", {"samples": 8})
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["pass_at_k"]["all"]["pass@8"]["mean"] == pytest.approx(0.75)
    text = (tmp_path / "report.md").read_text()
    assert "## pass@k" in text and "pass@8 [95% CI]" in text and "2107.03374" in text
    assert "| nq | 2 | 8 | 0.062 [" in text
