"""A tiny random Qwen2 fitted to open its first turn with one of three moves, so that the samples of
one GRPO group get different rewards from our real reward function.

Stand-in for a real policy (none fits CI's 2 cores): fitted on real prompts (the Qwen2.5 chat
template, our preprocessing) to continue `<|im_start|>assistant\\n` with one of `MOVES[protocol]`,
weighted by `WEIGHTS`: a search, the right answer `RIGHT` or the wrong answer `WRONG` (the rest of
its probability is noise).
The rows built by `rows()` all have `RIGHT` as their gold answer (a tiny model cannot answer real
questions), so `verl_search.rewards.compute_score` scores the right answer 1 and the others 0.
Everything after a search is the model's own noise.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.training.fit_cache import cached_fit
from tests.training.searching_model import QUERY, SEARCH_TURNS, _prompts

RIGHT, WRONG = "Emma Thomas", "Steven Spielberg"
"""The rows' gold answer and a wrong one; neither is the stand-in's search query (`QUERY`)."""
UNREACHABLE = "Zzyzx Road"
"""The gold answer of the rows the stand-in never answers (`fitted_answering_model(unanswerable=...)`): all of
their samples score alike, a group without signal."""
MOVES = {
    "tool": {"search": SEARCH_TURNS["tool"], "right": f"<answer> {RIGHT} </answer><|im_end|>",
             "wrong": f"<answer> {WRONG} </answer><|im_end|>"},
    "search_r1": {"search": SEARCH_TURNS["search_r1"], "right": f"<answer> {RIGHT} </answer>",
                  "wrong": f"<answer> {WRONG} </answer>"},
    # ReSearch's reward: the right boxed answer with EOS scores 1; the wrong one is written without `\boxed{}`,
    # which its format rules score 0 (a boxed wrong answer would earn 0.1, blurring rewarded and unrewarded)
    "research": {"search": SEARCH_TURNS["research"],
                 "right": f"<think>\n</think>\n<answer>\n\\boxed{{{RIGHT}}}\n</answer><|im_end|>",
                 "wrong": f"<think>\n</think>\n<answer>\n{WRONG}\n</answer><|im_end|>"},
}
WEIGHTS = {"search": 2, "right": 2, "wrong": 1}
"""Weight of each move in the fitting loss: the fitted model samples them about 2 : 2 : 1."""
FIT_STEPS = 200
"""Optimizer steps of the fit (`make_answering_model`)."""


def rows(source_rows: list[dict], count: int) -> list[dict]:
    """The first `count` preprocessed rows, each with gold answer `RIGHT`."""
    out = []
    for row in source_rows[:count]:
        row = json.loads(json.dumps(row))
        row["reward_model"]["ground_truth"] = {"target": [RIGHT]}
        out.append(row)
    return out


def make_answering_model(base_folder: Path, out: Path, source_rows: list[dict], protocol: str,
                         tool_schema: dict | None = None, steps: int = FIT_STEPS, seed: int = 0,
                         weights: dict[str, float] = WEIGHTS) -> Path:
    """Copy of the tiny model at `base_folder` fitted to `MOVES[protocol]` in `weights`; returns `out`.

    200 steps, on the first prompt (search : right : wrong): tool protocol 0.30 : 0.37 : 0.18 on `tiny_qwen`,
    0.34 : 0.39 : 0.19 on `tiny_qwen_hd64`; Search-R1 protocol 0.39 : 0.39 : 0.20 on `tiny_qwen_hd64` (with the
    query inside `<search> ... </search>` on the tag's line it was 0.09 : 0.21 : 0.08: the tiny model did not
    learn which tag a name follows two tokens back). After 100 steps the tool search (30 tokens) had 0.09. With
    weights 4 : 3 : 0 the tool protocol on `tiny_qwen` had 0.46 : 0.40 : 0.00.

    `out/fitted.json` holds each move's probability under the fitted model, per prompt.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base_folder)
    model = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    moves = {name: tokenizer.encode(text, add_special_tokens=False) for name, text in MOVES[protocol].items()}
    names = list(moves)
    move_weights = torch.tensor([float(weights[name]) for name in names])
    prompts = _prompts(tokenizer, source_rows, protocol, tool_schema)

    def log_probs(prompt: list[int]):
        """Log-probability of each move after `prompt`: one forward pass over the moves, right-padded."""
        width = max(len(ids) for ids in moves.values())
        input_ids = torch.tensor([prompt + moves[n] + [0] * (width - len(moves[n])) for n in names])
        mask = torch.tensor([[1] * (len(prompt) + len(moves[n])) + [0] * (width - len(moves[n])) for n in names])
        hidden = model.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        # the LM head (151k-token vocabulary) only where a move's token is predicted, not at the padding: 102
        # against 195 ms a step (moves of 22, 9 and 9 tokens), the same sums to ~1e-7
        valid = mask[:, len(prompt):].bool()
        logits = model.lm_head(hidden[:, len(prompt) - 1:-1][valid]).log_softmax(-1)
        picked = logits.gather(-1, input_ids[:, len(prompt):][valid].unsqueeze(-1)).squeeze(-1)
        move = torch.arange(len(names)).unsqueeze(1).expand_as(valid)[valid]
        return torch.zeros(len(names)).index_add(0, move, picked)

    # fused: one kernel over all parameters, 34 ms a step against 172 for the loop over them (the 151k-token
    # embedding is most of the model); the same update to ~1e-7 a step (fitted move probabilities within 0.007)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0, fused=True)
    model.train()
    for step in range(steps):
        # the mixture's likelihood: every move of one prompt in each step, so no move is the last one seen
        loss = -(move_weights * log_probs(prompts[step % len(prompts)])).sum() / move_weights.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        probabilities = [dict(zip(names, log_probs(prompt).exp().tolist())) for prompt in prompts]
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "fitted.json").write_text(json.dumps({"protocol": protocol, "steps": steps, "probabilities": probabilities}))
    return out


def fitted_answering_model(base_folder: Path, folder: Path, protocol: str, count: int,
                           unanswerable: int = 0, weights: dict[str, float] = WEIGHTS) -> tuple[Path, Path, Path]:
    """(model fitted on the first 4 mini-wiki training rows' prompts to `MOVES[protocol]` in `weights`, train
    parquet of the first `count` of those rows, validation parquet of all 4), written under `folder`; every row's
    gold answer is `RIGHT`. With `unanswerable`, the train parquet also holds that many of the following rows with
    gold `UNREACHABLE`.

    The fit is seeded; with `VERL_SEARCH_TEST_CACHE` set (CI sets it for its whole run), a fitted model is kept
    there, keyed by the base model's config and everything the fit reads, and reused.
    """
    import yaml

    from tests.conftest import MINI_QA
    from verl_search.datasets.preprocess import Source, build_rows, write_parquet
    from verl_search.verl_config.shipped import config_path

    source = rows(build_rows([Source.parse(str(MINI_QA))], "train", protocol, max_per_source=2, seed=0), 4)
    folder.mkdir(parents=True, exist_ok=True)
    unreachable = [{**row, "reward_model": {**row["reward_model"], "ground_truth": {"target": [UNREACHABLE]}}}
                   for row in source[count:count + unanswerable]]
    write_parquet(source[:count] + unreachable, folder / "train.parquet")
    write_parquet(source, folder / "val.parquet")
    schema = yaml.safe_load(Path(config_path("tool")).read_text())["tools"][0]["tool_schema"]
    fit = [protocol, MOVES[protocol], weights, FIT_STEPS, source, schema,
           json.loads((Path(base_folder) / "config.json").read_text())]
    model = cached_fit(f"answering_{protocol}", fit, folder / "model",
                       lambda out: make_answering_model(base_folder, out, source, protocol, schema,
                                                        weights=weights))
    return model, folder / "train.parquet", folder / "val.parquet"
