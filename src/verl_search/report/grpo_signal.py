"""Why GRPO moved or did not move: the learning signal of each GRPO step, from verl's logged step
metrics (`VERL_FILE_LOGGER_PATH`) and the rollouts verl dumps per step (`trainer.rollout_data_dir`,
`STEP.jsonl`: `input`, `output`, `gts`, `score`, `uid` per response).

GRPO gives a response the advantage `(reward - group mean) / (group std + 1e-6)` over the `rollout.n`
responses to one prompt, and every loss token of the response carries it (verl's
`core_algos.compute_grpo_outcome_advantage`, `norm_adv_by_std_in_grpo=True`). A group whose rewards
are all equal therefore gives all its tokens advantage 0: the policy gradient of a step comes only
from the groups whose rewards differ. This module counts them, with the entropy, KL, loss and
gradient norm verl logged, and writes the report's "Why GRPO moved / did not move" section.

A reward with format credit (Search-R1's 0.2 for a well-formed wrong answer, 0.1 for a malformed one) makes a
group's rewards differ when only the format differs: its advantages then rank formats, not answers. The answer
score of each dumped response (EM, or token F1 for an F1 reward: `verl_search.rewards.compute_score`'s `acc` /
`f1`, recomputed from its `output` and `gts`) separates the groups with answer signal from the format-only ones.
With group filtering, `generated_per_trained` is the generation paid per trained group at each step.
Pure functions, except `read_rollouts` (reads files) and `tokenizer_counter` (loads a tokenizer).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

#: verl's step metrics shown per step: label -> logged key (absent keys are shown as "-")
METRICS = {
    "reward mean": "critic/score/mean",
    "groups generated": "search/groups/generated",
    "groups filtered out": "training/filter_groups/evicted_samples",
    "reward before filtering": "search/score_before_filter/mean",
    "groups trained without signal": "search/groups/trained_without_signal",
    "advantage min": "critic/advantages/min",
    "advantage max": "critic/advantages/max",
    "entropy (nats/token)": "actor/entropy",
    "pg loss": "actor/pg_loss",
    "KL loss": "actor/kl_loss",
    "PPO KL": "actor/ppo_kl",
    "rollout-vs-trainer KL": "rollout_corr/kl",
    "grad norm": "actor/grad_norm",
    "lr": "actor/lr",
}
#: two rewards closer than this count as equal (verl's rewards are float32)
EQUAL = 1e-6
#: the answer measure -> its key in `compute_score`'s result
ANSWER_KEYS = {"em": "acc", "f1": "f1"}
FILTER_METRICS = ("reward", "answer")
"""`StudyOptions.filter_metric`: what must differ within a group for group filtering to keep it."""
_OBSERVATION = re.compile(r"<information>.*?</information>", re.S)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_SESSION_KEY = re.compile(r"^(.+)_(\d+)_(\d+)$")


def trained_measure(reward: str, protocol: str) -> str:
    """The measure GRPO's reward pays (a `quickstart.frontier.FRONTIER_MEASURES` key): `f1` for an F1 reward
    (`--reward f1`, or the `research` protocol, whose reward is ReSearch's F1), else `em`.

    >>> trained_measure("em", "search_r1"), trained_measure("f1", "search_r1"), trained_measure("em", "research")
    ('em', 'f1', 'f1')
    """
    return "f1" if reward == "f1" or protocol == "research" else "em"


def filter_metric_key(filter_metric: str, reward: str = "em", protocol: str = "search_r1") -> str:
    """verl's `algorithm.filter_groups.metric` for `filter_metric`: `reward` (verl's score, format credit
    included: a group whose answers are all wrong but one malformed is kept) or, for `answer`, the output of
    `compute_score` that holds the answer score alone: `acc` (EM) or `f1` where GRPO's reward pays token F1
    (`trained_measure`). verl's reward loop hands every key of the reward's dict to the replay buffer
    as `reward_extra_info`, where DAPO's filter reads a metric other than `reward`.

    >>> filter_metric_key("answer"), filter_metric_key("answer", "f1"), filter_metric_key("reward", "f1")
    ('acc', 'f1', 'reward')

    Raises:
        ValueError: `filter_metric` is not one of `FILTER_METRICS`.
    """
    if filter_metric not in FILTER_METRICS:
        raise ValueError(f"filter_metric={filter_metric!r}: use one of {', '.join(FILTER_METRICS)}")
    return "reward" if filter_metric == "reward" else ANSWER_KEYS[trained_measure(reward, protocol)]


def read_rollouts(folder: Path) -> dict[int, list[dict]]:
    """verl's rollout dumps under `folder` (`STEP.jsonl`, one JSON object per response) by step; a
    missing folder gives `{}`, files not named by a step number and torn lines are skipped."""
    steps: dict[int, list[dict]] = {}
    for path in sorted(Path(folder).glob("*.jsonl")) if Path(folder).is_dir() else []:
        if not path.stem.isdigit():
            continue
        rows = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        steps[int(path.stem)] = rows
    return steps


def group_id(row: dict) -> str:
    """The GRPO group of a dumped response: the prompt's `uid` (verl's v1 trainer dumps the key
    `{uid}_{session}_{index}`, whose `uid` part is the group), else the prompt text `input`.

    >>> group_id({"uid": "5da25db8-4720_3_0", "input": "q"})
    '5da25db8-4720'
    >>> group_id({"input": "q"})
    'q'
    """
    uid = row.get("uid")
    if not uid:
        return str(row["input"])
    match = _SESSION_KEY.match(str(uid))
    return match.group(1) if match else str(uid)


def model_text(output: str) -> str:
    """`output` without its `<information>...</information>` observations: the text the policy
    wrote, whose tokens are the loss tokens (observation tokens are masked out of the loss)."""
    return _OBSERVATION.sub("", output)


def _variance(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


def _differ(values: list[float]) -> bool:
    return max(values) - min(values) > EQUAL


def answer_score(row: dict, answer: str = "em") -> float | None:
    """The answer score of a dumped response: `compute_score`'s EM (`acc`) or token F1 (`f1`, `answer`) of the
    answer in its `output` against its `gts`, without format credit; None for a row without both.

    >>> answer_score({"output": "<think>x</think>\\n<answer> Paris </answer>", "gts": {"target": ["Paris"]}})
    1.0
    """
    from verl_search.rewards import compute_score

    if "output" not in row or "gts" not in row:
        return None
    return float(compute_score("", row["output"], row["gts"])[ANSWER_KEYS[answer]])


def rollout_signal(rows: list[dict], count_tokens: Callable[[str], int] | None = None, answer: str = "em") -> dict:
    """The learning signal of one step's dumped responses.

    Args:
        rows: one step's responses (`score`: reward; `uid` or `input`: group, `group_id`; `output`; `gts`).
        count_tokens: text -> token count (`tokenizer_counter`); `None`: no token counts.
        answer: the answer measure the reward pays, `em` (default) or `f1` (`answer_score`).

    Returns `{"responses", "groups", "group_size": [min, max], "reward_mean", "reward_std" (over all
    responses, population std, reward units), "within_group_variance" (mean over groups of the
    population variance of their rewards, reward units squared), "zero_variance_groups" (groups whose
    rewards are all equal: zero advantage), "answer_groups" (groups whose rewards and answer scores differ),
    "format_only_groups" (groups whose rewards differ and answer scores do not: format credit alone),
    "em_groups" (groups whose EM differs), "answer" (the measure), "responses_with_advantage",
    "distinct_answers" (mean over groups of the distinct `<answer>` texts), "loss_tokens", "tokens_with_advantage"
    (tokens of `model_text`, re-tokenized; `None` without `count_tokens`)}`; the three answer counts are `None`
    where a row has no `output` or `gts`.

    Raises:
        ValueError: `rows` is empty, a row has no `score`, or `answer` is not a key of `ANSWER_KEYS`.
    """
    if answer not in ANSWER_KEYS:
        raise ValueError(f"answer={answer!r}: use one of {', '.join(ANSWER_KEYS)}")
    if not rows:
        raise ValueError("rollout_signal needs the responses of a step, got none")
    groups: dict[str, list[dict]] = {}
    for row in rows:
        if "score" not in row:
            raise ValueError(f"a dumped response has no 'score' (keys: {sorted(row)}); pass verl's rollout dump")
        groups.setdefault(group_id(row), []).append(row)
    rewards = [float(r["score"]) for r in rows]
    varying = {g: m for g, m in groups.items() if _differ([float(r["score"]) for r in m])}
    answer_groups = format_only = em_groups = None
    if all("output" in r and "gts" in r for r in rows):
        scores = {g: [answer_score(r, answer) for r in m] for g, m in groups.items()}
        ems = {g: [answer_score(r, "em") for r in m] for g, m in groups.items()} if answer != "em" else scores
        answer_groups = sum(_differ(scores[g]) for g in varying)
        format_only = len(varying) - answer_groups
        em_groups = sum(_differ(values) for values in ems.values())
    with_advantage = [r for m in varying.values() for r in m
                      if abs(float(r["score"]) - sum(x["score"] for x in m) / len(m)) > EQUAL]
    tokens = with_tokens = None
    if count_tokens is not None:
        tokens = sum(count_tokens(model_text(r.get("output", ""))) for r in rows)
        with_tokens = sum(count_tokens(model_text(r.get("output", ""))) for r in with_advantage)
    answers = [len({(_ANSWER.findall(r.get("output", "")) or [""])[-1].strip().lower() for r in m}) for m in groups.values()]
    sizes = [len(m) for m in groups.values()]
    return {"responses": len(rows), "groups": len(groups), "group_size": [min(sizes), max(sizes)],
            "reward_mean": sum(rewards) / len(rewards), "reward_std": _variance(rewards) ** 0.5,
            "within_group_variance": sum(_variance([float(r["score"]) for r in m]) for m in groups.values()) / len(groups),
            "zero_variance_groups": len(groups) - len(varying), "answer_groups": answer_groups,
            "format_only_groups": format_only, "em_groups": em_groups, "answer": answer,
            "responses_with_advantage": len(with_advantage),
            "distinct_answers": sum(answers) / len(answers), "loss_tokens": tokens, "tokens_with_advantage": with_tokens}


def step_signals(steps: dict[int, dict], rollouts: dict[int, list[dict]],
                 count_tokens: Callable[[str], int] | None = None, answer: str = "em") -> list[dict]:
    """Per logged GRPO step, in order: `{"step", "metrics": {label: value or None} (`METRICS`),
    "em": search/em/mean, "rollouts": rollout_signal (with `answer`) or None (no dump kept for that step),
    "trained_groups": the groups trained on (the dump's, else groups generated minus filtered out; None
    without either), "generated_per_trained": groups generated per trained group (None unless both are known)}`."""
    out = []
    for step in sorted(steps.keys() | rollouts.keys()):
        logged = steps.get(step, {})
        metrics = {label: logged.get(key) for label, key in METRICS.items()}
        signal = rollout_signal(rollouts[step], count_tokens, answer) if rollouts.get(step) else None
        generated = metrics["groups generated"]
        trained = signal["groups"] if signal else (
            generated - (metrics["groups filtered out"] or 0) if generated is not None else None)
        out.append({"step": step, "metrics": metrics, "em": logged.get("search/em/mean"), "rollouts": signal,
                    "trained_groups": trained,
                    "generated_per_trained": generated / trained if generated is not None and trained else None})
    return out


def _num(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if abs(value) < 1e-3 and value else f"{value:.{digits}f}"


def signal_table(signals: list[dict]) -> str:
    """Markdown: one row per step, the `rollout_signal` columns ("-" where no rollouts were kept) and
    verl's logged metrics (`METRICS`)."""
    head = ["step", "responses / groups", "reward mean ± std", "within-group reward variance", "zero-variance groups",
            "groups: answer / format-only variance", "responses with advantage ≠ 0",
            "loss tokens with advantage ≠ 0", "distinct answers per group", *(label for label in METRICS if label != "reward mean"),
            "groups generated per trained group"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---:"] * len(head)) + " |"]
    for s in signals:
        r, m = s["rollouts"], s["metrics"]
        if r:
            tokens = "-" if r["tokens_with_advantage"] is None else f"{r['tokens_with_advantage']} of {r['loss_tokens']}"
            kinds = "-" if r["answer_groups"] is None else f"{r['answer_groups']} / {r['format_only_groups']}"
            cells = [f"{r['responses']} / {r['groups']}", f"{r['reward_mean']:.3f} ± {r['reward_std']:.3f}",
                     f"{r['within_group_variance']:.4f}", f"{r['zero_variance_groups']} of {r['groups']}", kinds,
                     f"{r['responses_with_advantage']} of {r['responses']}", tokens, f"{r['distinct_answers']:.2f}"]
        else:
            cells = ["-", f"{_num(m['reward mean'])} (logged)", "-", "-", "-", "-", "-", "-"]
        cells += [_num(m[label], 4 if label == "lr" else 3) for label in METRICS if label != "reward mean"]
        cells.append(_num(s.get("generated_per_trained"), 2))
        lines.append(f"| {s['step']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _answer_sentence(signals: list[dict], kept: list[dict]) -> str | None:
    """The trained groups' answer signal over the kept rollouts; "Every trained group carried signal" only where
    every step's rollouts are kept and every trained group's answer scores differed."""
    counted = [s for s in kept if s["rollouts"]["answer_groups"] is not None]
    if not counted:
        return None
    r = [s["rollouts"] for s in counted]
    groups, answer = sum(x["groups"] for x in r), sum(x["answer_groups"] for x in r)
    measure = {"em": "EM", "f1": "token F1"}[r[0]["answer"]]
    where = f"step {', '.join(str(s['step']) for s in counted)}"
    if answer == groups and len(counted) == len(signals):
        return (f"Every trained group carried signal: in all {groups} trained groups ({where}) the answer scores "
                f"({measure}, recomputed from the kept rollouts) differed, not only the format credit.")
    missing = [s["step"] for s in signals if s not in counted]
    return (f"Of the {groups} trained groups in the kept rollouts ({where}), {answer} differed in their answer scores "
            f"({measure}), {sum(x['format_only_groups'] for x in r)} only by format credit (their advantages rank "
            f"formats, not answers) and {sum(x['zero_variance_groups'] for x in r)} not at all"
            + (f"; step {', '.join(map(str, missing))} kept no rollouts to count" if missing else "") + ".")


def explain(signals: list[dict], comparison: dict | None = None, filter_metric: str = "reward") -> list[str]:
    """Sentences (markdown bullets) on what the steps' signal shows: the held-out verdict (`comparison`:
    `report.compare.paired_bootstrap` of cold start -> GRPO EM, or `None`), the groups without reward
    variance, the trained groups' answer signal (`_answer_sentence`), group filtering (on `filter_metric`:
    `reward`, or a reward output such as `acc`) and the groups generated per trained group (and trained without
    signal at the limit of generation batches), the steps whose
    every advantage was 0, entropy, KL, and the updates made."""
    lines = []
    if comparison:
        low, high = comparison["ci95"]
        moved = "moved above" if low > 0 else ("fell below" if high < 0 else "did not move beyond")
        lines.append(f"Held-out EM {moved} its starting point: paired difference {comparison['mean_diff']:+.3f} "
                     f"[{low:+.3f}, {high:+.3f}] on {comparison['n']} questions ({comparison['better']} better, "
                     f"{comparison['worse']} worse).")
    kept = [s for s in signals if s["rollouts"]]
    if kept:
        zero = sum(s["rollouts"]["zero_variance_groups"] for s in kept)
        total = sum(s["rollouts"]["groups"] for s in kept)
        responses = sum(s["rollouts"]["responses_with_advantage"] for s in kept)
        tokens = [s["rollouts"]["tokens_with_advantage"] for s in kept]
        carried = "" if None in tokens else f" ({sum(tokens)} loss tokens)"
        lines.append(f"In the kept rollouts (step {', '.join(str(s['step']) for s in kept)}), {zero} of {total} groups "
                     f"had all rewards equal, so {responses} of {sum(s['rollouts']['responses'] for s in kept)} "
                     f"responses{carried} carried a non-zero advantage.")
        answered = _answer_sentence(signals, kept)
        if answered:
            lines.append(answered)
    flat = [s["step"] for s in signals if s["metrics"]["advantage min"] == 0 == s["metrics"]["advantage max"]]
    if flat:
        lines.append(f"Step {', '.join(map(str, flat))}: every advantage 0 (logged critic/advantages min = max = 0), "
                     f"so the policy-gradient loss was 0 and the update came from the other loss terms alone "
                     f"(entropy bonus, KL if on).")
    generated = [s["metrics"]["groups generated"] for s in signals if s["metrics"]["groups generated"] is not None]
    filtered = sum(s["metrics"]["groups filtered out"] or 0 for s in signals)
    if filtered:
        before = [s["metrics"]["reward before filtering"] for s in signals
                  if s["metrics"]["reward before filtering"] is not None]
        compared = "rewards" if filter_metric == "reward" else f"answer scores (`{filter_metric}`)"
        lines.append(f"Group filtering (DAPO's dynamic sampling): {filtered:.0f} groups had all {compared} equal and "
                     f"were replaced by fresh questions" + (f", of {sum(generated):.0f} generated" if generated else "")
                     + (f". Reward per response before filtering: {', '.join(_num(b) for b in before)} by step."
                        if before else "."))
    ratios = [(s["step"], s["generated_per_trained"]) for s in signals if s.get("generated_per_trained") is not None]
    if ratios and (filtered or any(r != 1 for _, r in ratios)):
        worst = max(ratios, key=lambda pair: pair[1])
        lines.append(f"Groups generated per trained group: {', '.join(f'{r:.1f}' for _, r in ratios)} by step (most "
                     f"{worst[1]:.1f}, step {worst[0]}).")
    unsignalled = [(s["step"], s["metrics"]["groups trained without signal"]) for s in signals
                   if s["metrics"]["groups trained without signal"]]
    if unsignalled:
        lines.append("At the limit of generation batches (`--max-gen-batches`), the step trained on the groups it had: "
                     + ", ".join(f"step {step}: {count:.0f} group(s) without signal" for step, count in unsignalled)
                     + " (their advantages 0).")
    ems = [s["em"] for s in signals if s["em"] is not None]
    sizes = [s["rollouts"]["group_size"][1] for s in kept]
    if ems and sizes and not filtered:
        p, n = sum(ems) / len(ems), max(sizes)
        lines.append(f"Training EM per response averaged {p:.3f}; a group of {n} independent responses at that rate "
                     f"holds at least one exact match with probability {1 - (1 - p) ** n:.2f}: with a constant format "
                     f"reward, that is the share of groups expected to carry any signal.")
    entropy = [s["metrics"]["entropy (nats/token)"] for s in signals if s["metrics"]["entropy (nats/token)"] is not None]
    if entropy:
        lines.append(f"Entropy of the policy on its own responses: {entropy[0]:.3f} -> {entropy[-1]:.3f} nats per loss "
                     f"token.")
    kl = [s["metrics"]["KL loss"] for s in signals if s["metrics"]["KL loss"] is not None]
    ppo_kl = [s["metrics"]["PPO KL"] for s in signals if s["metrics"]["PPO KL"] is not None]
    if kl:
        lines.append(f"KL loss to the reference: {kl[0]:.4g} -> {kl[-1]:.4g}.")
    else:
        lines.append("No KL loss was logged (verl logs actor/kl_loss only with use_kl_loss on, which needs a reference "
                     "model), so no step measured or penalised the distance from the starting point.")
    if ppo_kl and max(abs(v) for v in ppo_kl) == 0:
        lines.append("PPO KL 0 at every step: every update ran at probability ratio 1 on the step's own rollouts, "
                     "so PPO's clip never acted.")
    lrs = [s["metrics"]["lr"] for s in signals if s["metrics"]["lr"] is not None]
    if lrs:
        norms = ", ".join(_num(s["metrics"]["grad norm"]) for s in signals)
        lines.append(f"{len(signals)} steps at lr {_num(lrs[-1], 4)}; gradient norm per step: {norms}.")
    return [f"- {line}" for line in lines]


def section(signals: list[dict], comparison: dict | None = None, filter_metric: str = "reward") -> str:
    """The report's markdown section "Why GRPO moved / did not move": `explain` and `signal_table`."""
    verdict = "moved or did not move" if comparison is None else ("moved" if comparison["ci95"][0] > 0 else "did not move")
    return "\n".join([f"## Why GRPO {verdict}", "", "GRPO's advantage is a response's reward minus its group's mean "
                      "(over the responses to one prompt), divided by the group's std unless the recipe sets "
                      "`algorithm.norm_adv_by_std_in_grpo: false`: either way a group whose rewards are all equal "
                      "gives its tokens no gradient.", "", *explain(signals, comparison, filter_metric), "",
                      signal_table(signals)])


def tokenizer_counter(folder: str | Path) -> Callable[[str], int]:
    """text -> number of tokens of the tokenizer in `folder` (a Hugging Face model folder), without
    special tokens. Raises as `transformers.AutoTokenizer.from_pretrained`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])
