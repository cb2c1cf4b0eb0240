"""Names the replay buffer and its callers share, in a module that imports nothing (the quickstart
builds overrides with them without importing verl)."""

PERMUTE_KWARG, PERMUTE_SEED_KWARG = "permute_scores", "permute_seed"
"""`trainer.v1.sampler.sampler_kwargs` keys of the permuted-reward control (`training.replay_buffer`)."""

TRAIN_AT_LIMIT_KWARG = "train_at_max_gen_batches"
"""`trainer.v1.sampler.sampler_kwargs` key: when a step's generation batches reach
`algorithm.filter_groups.max_num_gen_batches`, train on the groups at hand instead of stopping the run
(`training.replay_buffer`)."""
