"""Names the CPU backend's pieces share, in a module that imports nothing (the plugin runs inside
`import verl`, so the modules it names must not be imported from it)."""

ROLLOUT_NAME = "verl_search_cpu"
"""`actor_rollout_ref.rollout.name` that selects the transformers rollout (`cpu/transformers_rollout.py`)."""
ADAPTER_PATH = "verl_search.cpu.transformers_rollout.TransformersServerAdapter"
"""The in-worker rollout adapter verl's `get_rollout_class(ROLLOUT_NAME)` returns."""
PLUGIN_MODULE = "verl_search.cpu.plugin"
"""The module verl imports through `VERL_USE_EXTERNAL_MODULES`."""
