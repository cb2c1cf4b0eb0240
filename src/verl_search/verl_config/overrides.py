"""Hydra override lists for verl's trainer config: the one home of reading and merging them.

An override is a string as `main_ppo` takes it on its command line (`key=value`, `+key=value`,
`++key=value`, `~key`). Hydra refuses a key set twice, so lists from several sources (a recipe's
CPU settings, eval's rollout settings, the user's own) are merged with `merge_overrides`.
"""

from __future__ import annotations


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
