"""The PPO Search-R1 recipe through verl's own trainer on the CPU, checked by every test of
`test_recipes_on_cpu.py` (imported here, so pytest collects them in this module too, on this module's `run`; the
tests of other recipes' behaviours skip). A module of its own so that README's test command fits its stand-in in one
worker while another trains the GRPO recipes (tests/scheduling.py)."""

from __future__ import annotations

import pytest

from tests.training.test_recipes_on_cpu import *  # noqa: F403 (the tests)
from tests.training.test_recipes_on_cpu import PPO_RUN, train_recipe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=[PPO_RUN])
def run(request, tiny_qwen_hd64, bm25_server, tmp_path_factory):
    """The PPO run of `test_recipes_on_cpu.train_recipe`."""
    return train_recipe(request.param, tiny_qwen_hd64, bm25_server, tmp_path_factory)
