"""Where verl-search meets verl's configuration: composing it, checking it, and the verl it is for.

* `compose`: verl's full trainer config from `ppo_trainer.yaml`, a recipe and overrides (hydra, CPU);
* `check`: `verl-search check-config` (a recipe checked on the CPU before it runs on GPUs);
* `shipped`: absolute paths of the YAMLs this package ships (tool configs, agent loops) for verl
  options that take a file path (`verl-search config-path`);
* `version`: the supported verl release and the guard the verl-facing entry points call first.

Importing this package or `shipped` / `version` does not import verl.
"""
