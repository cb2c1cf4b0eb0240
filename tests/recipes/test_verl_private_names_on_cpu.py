"""check-config reads two private registries of verl 0.9.1; a verl that renames them fails here, by name."""

import sys
import types

import pytest

from verl_search.verl_config.check import VERL_PRIVATE_NAMES, verl_private


@pytest.mark.parametrize("module, path, what", VERL_PRIVATE_NAMES)
def test_verl_still_has_the_private_registries_check_config_reads(module, path, what):
    registry = verl_private(module, path, what)
    expected = "hermes" if "tool_parser" in module else "tool_agent"
    assert expected in registry, f"{module}.{path} ({what}) no longer lists {expected!r}"


def test_a_renamed_registry_fails_with_its_name(monkeypatch):
    monkeypatch.setitem(sys.modules, "fake_verl_module", types.ModuleType("fake_verl_module"))
    with pytest.raises(RuntimeError, match=r"fake_verl_module\._registry .*update verl_search.verl_config.check"):
        verl_private("fake_verl_module", "_registry", "a registry")
