"""A cold start before GRPO: a few supervised steps on search-then-answer trajectories.

SmolLM2-135M-Instruct, prompted with Search-R1's instructions, never closes a `<search>` or
`<answer>` tag (a sampling probe: 0 of 32 samples at temperature 1), so every rollout of a GRPO
step scores 0 and the group advantages are all zero: RL has no signal to start from. Search-R1
trains 3B+ models that follow the format from the start; DeepSeek-R1 (arXiv 2501.12948, section
2.3.1) calls the small supervised warm-up that fixes this a "cold start".

The trajectories are built token for token as the Search-R1 agent loop builds them (the row's
chat-templated prompt, then `<think>..</think><search> QUESTION </search>`, then the real BM25
passages framed by the agent loop's own `observation_tokens`, then `<think>..</think><answer> GOLD
</answer>`), from training questions whose gold answer is in the question's own top-k passages.
Prompt and observation tokens are masked out of the loss, as verl's `response_mask` does in RL.

    python benchmarks/cold_start_sft.py --train runs/learn/train.parquet --index runs/learn/mini_bm25 \\
        --model SMOLLM2_FOLDER --out runs/learn/cold_start

Writes a Hugging Face model folder to OUT and OUT/cold_start.json (losses, examples, seconds).
`learn_search_cpu.py --cold-start N` runs it before training.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path

logger = logging.getLogger("cold_start_sft")

SEARCH_TURN = "<think> I need to look this up. </think>\n<search> {question} </search>"
ANSWER_TURN = "<think> The passages answer it. </think>\n<answer> {answer} </answer>"


def answerable_rows(rows: list[dict], retriever, topk: int, limit: int, seed: int) -> list[tuple[dict, list]]:
    """`(row, hits)` for up to `limit` rows whose gold answer (normalised) occurs in the top-`topk`
    passages of their own question, in a random order fixed by `seed`."""
    from verl_search.rewards.qa import normalize_answer

    rows = list(rows)
    random.Random(seed).shuffle(rows)
    hits = retriever.search([row["extra_info"]["question"] for row in rows], topk)
    chosen = []
    for row, row_hits in zip(rows, hits):
        text = normalize_answer(" ".join(hit.passage.contents for hit in row_hits))
        golds = [normalize_answer(g) for g in row["reward_model"]["ground_truth"]["target"]]
        if any(g and g in text for g in golds):
            chosen.append((row, row_hits))
        if len(chosen) == limit:
            break
    return chosen


def trajectory_tokens(row: dict, hits: list, tokenizer, obs_tokens: int) -> tuple[list[int], list[int]]:
    """`(input_ids, labels)` of one search-then-answer trajectory; labels are -100 on the prompt
    and the observation (the tokens the model does not write)."""
    from verl_search.agent_loop.protocol import observation_tokens
    from verl_search.tools.formatting import format_results

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    messages = [dict(m) for m in row["prompt"]]
    prompt = encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    question = row["extra_info"]["question"]
    documents = [{"id": h.passage.id, "contents": h.passage.contents} for h in hits]
    observation, _ = observation_tokens(format_results([question], [documents])[0], encode, obs_tokens)
    search = encode(SEARCH_TURN.format(question=question))
    answer = encode(ANSWER_TURN.format(answer=row["reward_model"]["ground_truth"]["target"][0]))
    ids = prompt + search + observation + answer
    labels = [-100] * len(prompt) + search + [-100] * len(observation) + answer
    return ids, labels


def cold_start(train_rows: list[dict], index: Path, model: str, out: Path, *, examples: int = 48, steps: int = 12,
               batch_size: int = 4, lr: float = 1e-4, topk: int = 3, obs_tokens: int = 160, seed: int = 0) -> dict:
    """Fine-tune `model` on `examples` search-then-answer trajectories for `steps` AdamW steps of
    `batch_size` trajectories; save the model and tokenizer to `out`. Returns the summary it also
    writes to `out/cold_start.json` (`losses` per step, `examples`, `seconds`).

    Raises:
        ValueError: if no training question has its answer in its own top-`topk` passages.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_search.retrieval.loader import resolve_index

    started = time.perf_counter()
    chosen = answerable_rows(train_rows, resolve_index(index).load(), topk, examples, seed)
    if not chosen:
        raise ValueError(f"no training question has a gold answer in its top-{topk} passages of {index}")
    tokenizer = AutoTokenizer.from_pretrained(model)
    network = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32)
    network.train()
    data = [trajectory_tokens(row, hits, tokenizer, obs_tokens) for row, hits in chosen]
    optimizer = torch.optim.AdamW(network.parameters(), lr=lr)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    order = random.Random(seed)
    losses = []
    for step in range(steps):
        batch = order.sample(data, min(batch_size, len(data)))
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in batch])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
        attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in batch])
        loss = network(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(round(float(loss.item()), 4))
        logger.info("cold start step %d/%d: loss %.4f", step + 1, steps, losses[-1])
    out.mkdir(parents=True, exist_ok=True)
    network.save_pretrained(out)
    tokenizer.save_pretrained(out)
    summary = {"examples": len(data), "steps": steps, "batch_size": batch_size, "lr": lr, "losses": losses,
               "seconds": round(time.perf_counter() - started, 1),
               "questions": [row["extra_info"]["question"] for row, _ in chosen]}
    (out / "cold_start.json").write_text(json.dumps(summary, indent=1))
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", required=True, help="training parquet (verl rows, Search-R1 protocol)")
    parser.add_argument("--index", required=True, help="BM25 or dense index folder")
    parser.add_argument("--model", required=True, help="Hugging Face model folder")
    parser.add_argument("--out", required=True)
    parser.add_argument("--examples", type=int, default=48)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import pandas as pd

    rows = pd.read_parquet(args.train).to_dict("records")
    for row in rows:  # parquet gives numpy arrays for lists
        row["reward_model"]["ground_truth"]["target"] = list(row["reward_model"]["ground_truth"]["target"])
    summary = cold_start(rows, Path(args.index), args.model, Path(args.out), examples=args.examples,
                         steps=args.steps, lr=args.lr)
    print(f"cold start: {summary['examples']} trajectories, {summary['steps']} steps, loss "
          f"{summary['losses'][0]} -> {summary['losses'][-1]}, {summary['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
