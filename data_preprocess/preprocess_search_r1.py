"""FlashRAG-format QA JSONL files -> one verl parquet file (train or test merge).

Examples (paths are arguments; `../shared/data/qa` holds the seven benchmarks):

    # training set, tool-call protocol (MuSiQue train is the training set on disk here;
    # Search-R1 trains on NQ + HotpotQA train)
    python data_preprocess/preprocess_search_r1.py --split train --protocol tool \
        --input ../shared/data/qa/musique/train.jsonl --out data/train.parquet

    # test merge of the seven datasets, 200 questions each, Search-R1 tag protocol
    python data_preprocess/preprocess_search_r1.py --split test --protocol search_r1 --max-per-source 200 \
        --input ../shared/data/qa/{nq,triviaqa,popqa,bamboogle}/test.jsonl \
        --input ../shared/data/qa/{hotpotqa,2wikimultihopqa,musique}/dev.jsonl --out data/test.parquet

`--input NAME=PATH` names the data source; by default it is the file's folder name.
"""

from __future__ import annotations

import argparse
import logging
import sys

from verl_search.data.preprocess import RowError, Source, build_rows, write_parquet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", action="append", nargs="+", required=True, help="[NAME=]PATH of a JSONL file")
    parser.add_argument("--out", required=True, help="output parquet file (written atomically)")
    parser.add_argument("--split", choices=["train", "test"], required=True)
    parser.add_argument("--protocol", choices=["tool", "search_r1"], default="tool")
    parser.add_argument("--max-per-source", type=int, default=None, help="random sample of at most N rows per input")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--topk", type=int, default=None, help="passages per search for these rows")
    parser.add_argument("--on-bad-row", choices=["error", "skip"], default="error")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    sources = [Source.parse(spec) for group in args.input for spec in group]
    try:
        rows = build_rows(sources, args.split, args.protocol, args.max_per_source, args.seed, args.topk, args.on_bad_row)
    except (RowError, FileNotFoundError) as exc:
        logging.error("%s", exc)
        return 2
    write_parquet(rows, args.out)
    logging.info("wrote %d rows to %s", len(rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
