"""The CPU backend: verl's trainer and rollouts on a machine without a GPU, through verl's own hooks.

`plugin` (imported by verl through `VERL_USE_EXTERNAL_MODULES`) registers `platform` (the CPU
platform), verl's FSDP engines for device `cpu`, the rollouts (`vllm_cpu`: verl's vLLM rollout on
the CPU build of vLLM; `transformers_rollout`: the fallback engine) and the patches `verl_patches`.
`engine` chooses the rollout engine, `overrides` holds what a recipe needs on the CPU (overrides and
environment), `local_ray` starts a local Ray that loads the plugin (eval's vLLM rollout). Nothing
here is imported by the GPU path. See docs/cpu-engine.md.
"""
