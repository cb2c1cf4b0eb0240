"""LLM generation engines behind verl's client interface (token ids in, token ids out), for `verl-search eval`
and the CPU training rollout (`verl_search.cpu.transformers_rollout`), and the model loading they share."""
