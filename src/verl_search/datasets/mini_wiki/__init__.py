"""The mini-wiki data files (gzip JSONL) and their attribution, README.md; read them through `verl_search.datasets`."""
