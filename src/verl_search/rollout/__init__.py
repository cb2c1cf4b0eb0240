"""Rollouts through verl's own agent loop on any engine: verl config composition, LLM clients, batches."""
