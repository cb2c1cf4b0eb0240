"""Data: prompt templates and FlashRAG JSONL -> verl parquet preprocessing."""
