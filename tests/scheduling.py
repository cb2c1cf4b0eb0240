"""Test-only: the order README's test command hands the modules out in, and which of them run alone.

README's test command runs in two steps: every module not marked `timed` in three pytest-xdist workers (`-m "not
timed" -n 3 --dist loadfile --no-loadscope-reorder`: a module stays in one worker, and the modules are handed out in
the order `order_and_mark` leaves them), then the `timed` ones in one process. `timed` marks the modules that bound a
time or load the cores (`TIMED_MODULES`): they run alone. Every test process runs with `OMP_WAIT_POLICY=PASSIVE`
(tests/conftest.py), so the workers share the cores when more than one computes.

Trainer runs (verl's `main_ppo`, the quickstart's stages) and the vLLM evaluation's replica do not run side by
side: they take turns through `tests/trainer_runs.py`'s lock, since two of them do not fit in the machine's memory.
They are the suite's critical path (1,602 s of turns one after the other on 2 cores in a CI run of 2026-11-30;
every run prints its turns at its end), and a trainer spends its first two minutes starting Ray, vLLM and FSDP on
about one core: the third worker fills that core. So `FIRST` hands
out the GRPO recipes' and the PPO recipe's modules first (each fits its stand-in, then waits for its turn: one fits
while the other trains), then the modules that run vLLM, then the transformers fallback's run (handed out with the
first two, it would leave the third worker waiting for its turn as well); every other module follows in pytest's
order, taken by whichever worker is free. A worker whose module waits for the lock takes no other module meanwhile
(pytest-xdist hands a worker more once at most 2 of its tests are pending); the others go on.
(`--dist loadgroup`, which could group tests across modules, does not group with pytest 9.2: pytest-xdist 3.8.0
writes the group into `item._nodeid`, which pytest 9.2 no longer reads.)
"""

from __future__ import annotations

import pytest

FIRST = (
    "training/test_recipes_on_cpu.py",  # the GRPO recipes' runs and the resumed one: 830-1,250 s (docs/development.md)
    "training/test_recipe_ppo_on_cpu.py",  # the PPO recipe's run, with the same checks: 186-396 s
    "eval/test_eval_vllm_on_cpu.py",  # three models on one vLLM replica: 123-267 s
    "reliability/test_eval_resume_after_kill_on_cpu.py",
    "eval/test_judge_on_cpu.py",
    "eval/test_eval_on_cpu.py",
    "quickstart/test_quickstart_on_cpu.py",  # trains only without README's run beside it
    # after the vLLM modules: handed out first, it would leave a third worker waiting for its turn at the start
    "training/test_transformers_rollout_on_cpu.py",  # fit, 1 step on the transformers fallback: 83-352 s
)
"""Modules handed out first, in this order (see above); every other module follows them in pytest's order."""
TIMED_MODULES = ("server/test_ray_serve_on_cpu.py", "server/test_ray_serve_hybrid_rerank_on_cpu.py",
                 "reliability/test_soak_on_cpu.py", "server/test_ray_two_nodes_on_cpu.py")
"""Modules marked `timed`: the two-node test bounds the service's recovery (30 s), the soak loads the cores
with 256 clients, the Ray Serve modules start clusters whose readiness they wait for."""


def module_of(item: pytest.Item) -> str:
    """`item`'s module path under tests/ (`training/test_recipes_on_cpu.py`)."""
    return item.nodeid.split("::", 1)[0].removeprefix("tests/")


def rank(item: pytest.Item) -> int:
    """Hand-out position of `item`'s module: `FIRST`'s, after them otherwise."""
    module = module_of(item)
    return FIRST.index(module) if module in FIRST else len(FIRST)


def order_and_mark(items: list[pytest.Item]) -> None:
    """Mark the items of `TIMED_MODULES` `timed` and sort `items` in place by `rank` (stable: a module's items
    keep pytest's order, and so do the modules not in `FIRST`)."""
    for item in items:
        if module_of(item) in TIMED_MODULES:
            item.add_marker(pytest.mark.timed)
    items.sort(key=rank)
