"""pass@k over sampled rollouts (`verl-search eval --samples N --temperature T`): the chance that at least one of
k samples of a question is correct, by the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language
Models Trained on Code", arXiv 2107.03374, section 2.1, eq. 1), per question from its n samples of which c are
correct, averaged over questions, with a 95% percentile bootstrap interval over questions (Efron and Tibshirani,
"An Introduction to the Bootstrap", 1993, ch. 13). A sample is correct when its exact match is 1. Standard library
only.
"""

from __future__ import annotations

import random
from collections import defaultdict

PASS_AT_K = (1, 4, 8)
"""The k reported (each where k <= the samples per question)."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one question: `1 - C(n - c, k) / C(n, k)` (Chen et al. 2021, eq. 1), computed as
    `1 - prod_{i = n - c + 1}^{n} (1 - k / i)`, their numerically stable form.

    Args:
        n: samples of the question (>= 1); c: how many of them are correct (0..n); k: 1..n.

    Returns:
        the probability that k samples drawn without replacement from the n hold at least one correct one.

    Raises:
        ValueError: if `n < 1`, `c` outside 0..n or `k` outside 1..n (the message names the value).

    >>> pass_at_k(10, 0, 4), pass_at_k(10, 10, 1), pass_at_k(4, 1, 1), round(pass_at_k(8, 1, 4), 4)
    (0.0, 1.0, 0.25, 0.5)
    >>> round(pass_at_k(8, 2, 4), 4)  # 1 - C(6, 4) / C(8, 4) = 1 - 15 / 70
    0.7857
    """
    if n < 1:
        raise ValueError(f"pass@k needs at least one sample, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"correct samples c={c} must lie in 0..n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must lie in 1..n={n}: sample at least k rollouts per question (--samples)")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def bootstrap_interval(values: list[float], samples: int = 10000, seed: int = 0) -> list[float]:
    """95% percentile bootstrap interval of the mean of `values` (resampled with replacement `samples` times,
    `random.Random(seed)`); `[0.0, 1.0]` for an empty list.

    >>> bootstrap_interval([1.0, 1.0, 1.0])
    [1.0, 1.0]
    """
    n = len(values)
    if n == 0:
        return [0.0, 1.0]
    rng = random.Random(seed)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(samples))
    return [means[int(0.025 * (samples - 1))], means[int(round(0.975 * (samples - 1)))]]


def summarize_pass_at_k(records: list[dict], ks: tuple[int, ...] = PASS_AT_K, bootstrap: int = 2000,
                        seed: int = 0) -> dict[str, dict]:
    """pass@k per data source and for `all`, from sampled trajectory records.

    Args:
        records: eval records with `id` (`data_source/id#sample`, `rows.repeat_rows`), `data_source` and `em`.
        ks: the k to report; a k above every question's sample count is left out.
        bootstrap, seed: resamples (default 2,000: about a second per k and source for 1,000 questions) and
            seed of `bootstrap_interval`.

    Returns:
        `{source: {"questions": Q, "samples": [fewest, most] per question, "pass@K": {"mean", "ci95",
        "questions"}, ...}}`, each `pass@K` over the questions with at least K samples, `all` last.
    """
    from verl_search.report.records import question_id

    groups: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        correct = float(record["em"]) >= 1.0
        for source in (record["data_source"], "all"):
            groups[source][question_id(record["id"])].append(correct)
    out: dict[str, dict] = {}
    for source in sorted(groups, key=lambda s: (s == "all", s)):
        questions = groups[source]
        counts = [len(v) for v in questions.values()]
        entry: dict = {"questions": len(questions), "samples": [min(counts), max(counts)]}
        for k in ks:
            values = [pass_at_k(len(v), sum(v), k) for v in questions.values() if len(v) >= k]
            if values:
                entry[f"pass@{k}"] = {"mean": sum(values) / len(values),
                                      "ci95": bootstrap_interval(values, bootstrap, seed), "questions": len(values)}
        out[source] = entry
    return out


def pass_at_k_markdown(summary: dict[str, dict]) -> str:
    """`summarize_pass_at_k`'s result as a markdown section (heading, table, the estimator and its source)."""
    ks = sorted({int(key.split("@")[1]) for entry in summary.values() for key in entry if key.startswith("pass@")})
    lines = ["## pass@k", "",
             "| data source | questions | samples/q | " + " | ".join(f"pass@{k} [95% CI]" for k in ks) + " |",
             "| --- | ---: | ---: | " + " | ".join("---" for _ in ks) + " |"]
    for source, entry in summary.items():
        low, high = entry["samples"]
        cells = [f"{e['mean']:.3f} [{e['ci95'][0]:.3f}, {e['ci95'][1]:.3f}]" if (e := entry.get(f"pass@{k}"))
                 else "-" for k in ks]
        lines.append(f"| {source} | {entry['questions']} | {low if low == high else f'{low}-{high}'} | "
                     + " | ".join(cells) + " |")
    lines += ["", "pass@k: the chance that at least one of k samples of a question is an exact match, by the unbiased "
                  "estimator `1 - C(n - c, k) / C(n, k)` of n samples with c correct (Chen et al. 2021, arXiv "
                  "2107.03374, eq. 1), averaged over questions; 95% percentile bootstrap interval over questions "
                  "(`verl_search.report.pass_at_k`)."]
    return "\n".join(lines) + "\n"
