"""Names the CPU training pieces share, in a module that imports nothing (the plugin runs inside
`import verl`, so the modules it names must not be imported from it)."""

ROLLOUT_NAME = "verl_search_cpu"
"""`actor_rollout_ref.rollout.name` that selects the transformers rollout (`training/transformers_rollout.py`)."""
ADAPTER_PATH = "verl_search.training.transformers_rollout.TransformersServerAdapter"
"""The in-worker rollout adapter verl's `get_rollout_class(ROLLOUT_NAME)` returns."""
PLUGIN_MODULE = "verl_search.training.cpu_plugin"
"""The module verl imports through `VERL_USE_EXTERNAL_MODULES`."""
PERMUTE_KWARG, PERMUTE_SEED_KWARG = "permute_scores", "permute_seed"
"""`trainer.v1.sampler.sampler_kwargs` keys of the permuted-reward control (`training.replay_buffer`)."""
