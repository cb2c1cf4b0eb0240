"""Test-only: the order README's test command hands the slow modules out in, and which of them run alone.

README's test command runs the slow modules in three steps: the fast subset first, then `-m "slow and not timed"`
in two pytest-xdist workers (`-n 2 --dist loadfile --no-loadscope-reorder`: a module stays in one worker, and the
modules are handed out in the order `order_and_mark` leaves them, `SLOW_ORDER`), then `-m timed`
in one process. `timed` marks the modules that bound a time or load the cores (`TIMED_MODULES`): they run
alone, as before. Every test process runs with `OMP_WAIT_POLICY=PASSIVE` (tests/conftest.py), so the two
workers share the cores when both compute.

Trainer runs (verl's `main_ppo`, the quickstart's stages) do not run side by side: they take turns through
`tests/trainer_runs.py`'s lock, since two of them do not fit in the machine's memory. The order keeps both workers
busy all the same: one worker starts on the two GRPO runs of `test_recipes_on_cpu.py`, the other on the modules that
train nothing (vLLM evaluations, the judge, the quickstart's checks of README's run), and the PPO recipe's run
(`test_recipe_ppo_on_cpu.py`) and the transformers rollout's come after those, to take their turns between the
GRPO runs or after them. (`--dist loadgroup`, which could group tests across modules, does not group with pytest
9.2: pytest-xdist 3.8.0 writes the group into `item._nodeid`, which pytest 9.2 no longer reads.)
"""

from __future__ import annotations

import pytest

SLOW_ORDER = (
    "training/test_recipes_on_cpu.py",  # the two GRPO recipes' runs: 737-1,253 s (docs/development.md)
    "eval/test_eval_vllm_on_cpu.py",  # three models on one vLLM replica: 123-221 s
    "reliability/test_eval_resume_after_kill_on_cpu.py",
    "eval/test_judge_on_cpu.py",
    "eval/test_eval_on_cpu.py",
    "quickstart/test_quickstart_on_cpu.py",  # trains only without README's run beside it
    "training/test_recipe_ppo_on_cpu.py",  # the PPO recipe's run, with the same checks: 186-396 s
    "training/test_transformers_rollout_on_cpu.py",  # fit, 1 step on the transformers fallback: 207-352 s
)
"""Slow modules in the order they are handed out (see above); modules not named follow them."""
TIMED_MODULES = ("server/test_ray_serve_on_cpu.py", "server/test_ray_serve_hybrid_rerank_on_cpu.py",
                 "reliability/test_soak_on_cpu.py", "server/test_ray_two_nodes_on_cpu.py")
"""Modules marked `timed`: the two-node test bounds the service's recovery (30 s), the soak loads the cores
with 256 clients, the Ray Serve modules start clusters whose readiness they wait for."""


def module_of(item: pytest.Item) -> str:
    """`item`'s module path under tests/ (`training/test_recipes_on_cpu.py`)."""
    return item.nodeid.split("::", 1)[0].removeprefix("tests/")


def rank(item: pytest.Item) -> int:
    """Hand-out position of `item`'s module: `SLOW_ORDER`'s for a named slow module, after them otherwise."""
    module = module_of(item)
    named = item.get_closest_marker("slow") is not None and module in SLOW_ORDER
    return SLOW_ORDER.index(module) if named else len(SLOW_ORDER)


def order_and_mark(items: list[pytest.Item]) -> None:
    """Mark the items of `TIMED_MODULES` `timed` and sort `items` in place by `rank` (stable: a module's items
    keep pytest's order, and the modules not in `SLOW_ORDER` keep theirs)."""
    for item in items:
        if module_of(item) in TIMED_MODULES:
            item.add_marker(pytest.mark.timed)
    items.sort(key=rank)
