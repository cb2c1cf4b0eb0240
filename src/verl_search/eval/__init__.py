"""Evaluation: retrieval quality and (see `verl-search eval`) end-to-end QA over verl rollouts."""
