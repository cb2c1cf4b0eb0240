"""FlashRAG-format QA JSONL files -> one verl parquet file: `verl-search preprocess`, for users of the
Search-R1 layout (`data_preprocess/`). Same flags, same code (`verl_search.datasets.preprocess`); see
docs/data.md.

Examples:

    # training set, tool-call protocol (leaves out the default eval set's questions, mini-wiki:test)
    python data_preprocess/preprocess_search_r1.py --split train --protocol tool \
        --input ~/data/flashrag/musique/train.jsonl --out data/train.parquet

    # test merge of the seven datasets, 200 questions each, Search-R1 tag protocol
    python data_preprocess/preprocess_search_r1.py --split test --protocol search_r1 --max-per-source 200 \
        --input ~/data/flashrag/{nq,triviaqa,popqa,bamboogle}/test.jsonl \
        --input ~/data/flashrag/{hotpotqa,2wikimultihopqa,musique}/dev.jsonl --out data/test.parquet
"""

from __future__ import annotations

import sys

from verl_search.cli import main

if __name__ == "__main__":
    sys.exit(main(["preprocess", *sys.argv[1:]]))
