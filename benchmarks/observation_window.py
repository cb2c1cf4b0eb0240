"""How much of what the search returned the model sees, by the observation's token budget (`--max-obs-tokens`):
for each budget, the share of questions whose gold answer is visible in the observation of a search with the
question, rendered exactly as the agent loop renders it (the cold start's `trajectory_tokens`: same tokenizer,
same cut, `training.trajectories.gold_visible`), and the observation's mean length in tokens (what each search adds
to a rollout's prefill and to the trajectory the trainer scores). Prints markdown.

    python benchmarks/observation_window.py [--split test] [--budgets 160 320 480 640] [--topk 3] [--model smollm2]

The index is the quickstart's (BM25 over the shipped mini-wiki, built into a temporary folder unless `--index`
names one); the questions are every question of `mini-wiki:SPLIT` (320 for `test`), in the Search-R1 protocol.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default="test")
    parser.add_argument("--budgets", type=int, nargs="+", default=[160, 320, 480, 640])
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--model", default="smollm2", help="the tokenizer's model (HF folder or smollm2)")
    parser.add_argument("--index", type=Path, help="a BM25 index of mini-wiki (default: built into a temp folder)")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from verl_search.report.baselines import question_shape
    from verl_search.llm.models import end_of_sequence_ids, model_folder
    from verl_search.quickstart.data import corpus_path, split_rows
    from verl_search.retrieval.index_builder import BuildOptions, build_index
    from verl_search.retrieval.loader import resolve_index
    from verl_search.training.cold_start import gold_visible, prompt_builder, trajectory_tokens

    index = args.index
    if index is None:
        index = Path(tempfile.mkdtemp(prefix="obs-window-")) / "index"
        build_index(corpus_path(), index, BuildOptions(retriever="bm25", overwrite=True))
    rows = split_rows(args.split)
    hits = resolve_index(index).load().search([row["extra_info"]["question"] for row in rows], args.topk)
    folder = model_folder(args.model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    builder = prompt_builder(folder, tokenizer)
    ends = end_of_sequence_ids(tokenizer, folder)
    open_rows = [i for i, row in enumerate(rows) if question_shape(row["extra_info"]["question"]) == "open"]
    print(f"mini-wiki:{args.split}, {len(rows)} questions ({len(open_rows)} open), top {args.topk} BM25 passages, "
          f"{Path(folder).name}'s tokenizer\n")
    print("| observation budget (tokens) | gold visible, all | gold visible, open questions | observation tokens, mean |")
    print("| ---: | ---: | ---: | ---: |")
    for budget in args.budgets:
        visible, lengths = [], []
        for row, found in zip(rows, hits):
            ids, mask = trajectory_tokens(row, found, tokenizer, builder, max_turns=2, max_obs_tokens=budget,
                                          response_length=2 * (64 + budget) + 64, end_ids=ends)
            first = mask.index(1)
            lengths.append(sum(1 for m in mask[first:] if m == 0))
            visible.append(gold_visible(row, ids, mask, tokenizer))
        share_open = sum(visible[i] for i in open_rows) / max(1, len(open_rows))
        print(f"| {budget} | {sum(visible) / len(rows):.3f} ({sum(visible)}) | {share_open:.3f} "
              f"({sum(visible[i] for i in open_rows)}) | {sum(lengths) / len(lengths):.0f} |")


if __name__ == "__main__":
    main()
