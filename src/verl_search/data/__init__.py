"""Data: prompt templates, FlashRAG JSONL -> verl parquet preprocessing, and the download of the published
Search-R1 / FlashRAG files (`verl-search download`)."""
