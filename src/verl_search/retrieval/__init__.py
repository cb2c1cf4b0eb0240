"""Retrievers (BM25 on bm25s, dense on faiss + a sentence encoder), corpus lookup, index builder."""

from verl_search.retrieval.base import Hit, Passage, Retriever, split_contents

__all__ = ["Hit", "Passage", "Retriever", "split_contents"]
