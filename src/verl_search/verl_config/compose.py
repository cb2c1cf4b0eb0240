"""verl's trainer config from hydra overrides: the one home of override lists and of composing the config.

An override is a string as `main_ppo` takes it on its command line (`key=value`, `+key=value`,
`++key=value`, `~key`). Hydra refuses a key set twice, so lists from several sources (a recipe's
CPU settings, eval's rollout settings, the user's own) are merged with `merge_overrides`.

`compose_verl_config` composes, on the CPU (hydra; no GPU, no Ray), the config that
`python -m verl.trainer.main_ppo` would see: verl's `ppo_trainer.yaml` (found through
`pkg://verl.trainer.config`), then a recipe YAML if given, then the overrides.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig


def override_key(override: str) -> str:
    """The config key of a hydra override: `+a.b=1` -> `a.b`, `~a.b` -> `a.b`.

    >>> override_key("++actor_rollout_ref.rollout.n=8")
    'actor_rollout_ref.rollout.n'
    """
    return override.split("=", 1)[0].lstrip("+~")


def merge_overrides(defaults: list[str], given: list[str]) -> list[str]:
    """`defaults` whose key `given` does not set, then `given` (hydra refuses a key set twice).

    >>> merge_overrides(["trainer.device=cpu", "data.train_batch_size=4"], ["+data.train_batch_size=8"])
    ['trainer.device=cpu', '+data.train_batch_size=8']
    """
    keys = {override_key(o) for o in given}
    return [o for o in defaults if override_key(o) not in keys] + list(given)


def given_value(given: list[str], key: str, default: str | None = None) -> str | None:
    """The value the last override of `key` in `given` sets (`default` where none sets one).

    >>> given_value(["trainer.n_gpus_per_node=1", "trainer.n_gpus_per_node=2"], "trainer.n_gpus_per_node")
    '2'
    """
    for override in reversed(given):
        if override_key(override) == key and "=" in override:
            return override.split("=", 1)[1]
    return default


def verl_config_dir() -> str:
    """verl's own `trainer/config` folder (holds `ppo_trainer.yaml`)."""
    import verl

    return str(Path(verl.__file__).parent / "trainer" / "config")


def compose_verl_config(overrides: list[str] | None = None, recipe: str | os.PathLike | None = None) -> DictConfig:
    """The trainer config for `overrides` (hydra syntax, e.g. `"data.train_batch_size=8"`).

    Args:
        overrides: hydra overrides, applied last.
        recipe: a recipe YAML (one that extends `ppo_trainer` through
            `hydra.searchpath: [pkg://verl.trainer.config]`); default: verl's `ppo_trainer`.

    Raises:
        hydra's errors (`ConfigCompositionException`, `MissingConfigException`) for an unknown
        key or a recipe that does not compose.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if recipe is not None:
        recipe = Path(recipe).resolve()
        config_dir, config_name = str(recipe.parent), recipe.stem
    else:
        config_dir, config_name = verl_config_dir(), "ppo_trainer"
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name=config_name, overrides=list(overrides or []))
