"""Names the replay buffer and its callers share, in a module that imports nothing (the quickstart
builds overrides with them without importing verl)."""

PERMUTE_KWARG, PERMUTE_SEED_KWARG = "permute_scores", "permute_seed"
"""`trainer.v1.sampler.sampler_kwargs` keys of the permuted-reward control (`training.replay_buffer`)."""
