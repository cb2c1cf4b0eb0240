"""Compose verl's full trainer config on the CPU (hydra; no GPU, no Ray).

The config is what `python -m verl.trainer.main_ppo` would see: verl's `ppo_trainer.yaml`
(found through `pkg://verl.trainer.config`), then a recipe YAML if given, then overrides.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig


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
