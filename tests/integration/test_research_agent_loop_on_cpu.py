"""The ReSearch protocol through verl's own `AgentLoopWorker` on the CPU.

Real: verl's worker, dataset and reward loop (Ray actor, our reward via `pkg://`), the Qwen2.5
tokenizer and chat template, our agent loop registered through the shipped YAML, and a retrieval
server (uvicorn on 127.0.0.1, BM25 over the mini corpus). Stand-in: `ScriptedLLM` for the GPU
rollout engine (its replies end with the tokenizer's EOS where the script writes `<|im_end|>`).
"""

import asyncio
import json

import pytest
import yaml
from transformers import AutoTokenizer

from tests.conftest import MINI_QA
from tests.verl_helpers import ScriptedLLM, calls_for, row_tokens, tag_agent_config
from verl_search.datasets.preprocess import make_row, write_parquet
from verl_search.eval.batch import load_dataset, make_batch
from verl_search.agent_protocol import research
from verl_search.server.local import free_port
from verl_search.verl_config.shipped import config_path

QA = [json.loads(line) for line in MINI_QA.read_text().splitlines()]
GALLU = next(r for r in QA if r["question"] == "If Gallu is a demon Lilu is what?")
OTHERS = [r for r in QA if r["source"] == "2wiki"][:3]
ANSWER = "<think>Lilu is a spirit.</think> <answer> The final answer is \\[ \\boxed{a spirit} \\] </answer><|im_end|>"
SEARCH = "<think>Who is Lilu?</think> <search> Lilu mythology </search>"
OVERSHOOT = "<think>x</think> <search> Lilu </search> <result>invented by the model</result>"


def script(prompt_text, turn):
    if GALLU["question"] in prompt_text:  # one search, then the right answer and EOS
        return SEARCH if turn == 0 else ANSWER
    if OTHERS[0]["question"] in prompt_text:  # overshoots past </search>, then a wrong boxed answer
        return OVERSHOOT if turn == 0 else "<think>y</think> <answer> \\boxed{Rome} </answer><|im_end|>"
    if OTHERS[1]["question"] in prompt_text:  # never stops searching
        return f"<think>more</think> <search> query number {turn} </search>"
    return "<think>z</think> <answer> \\boxed{Rome} </answer>"  # no EOS: cut at the length limit


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen):
    return AutoTokenizer.from_pretrained(tiny_qwen)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    rows = [make_row(r, i, "test", r["source"], "research") for i, r in enumerate([GALLU, *OTHERS])]
    out = tmp_path_factory.mktemp("research") / "rows.parquet"
    write_parquet(rows, out)
    return out


def loop_yaml(folder, **settings):
    """A copy of the shipped agent-loop YAML whose research entry has `settings`."""
    entries = yaml.safe_load(open(config_path("agent-loop")))
    next(e for e in entries if e["name"] == "research_agent").update(settings)
    path = folder / "agent_loops.yaml"
    path.write_text(yaml.safe_dump(entries))
    return path


def rollout(model_dir, tokenizer, data_file, agent_loop_yaml, reward_handle=None, response_length=1500):
    from verl.experimental.agent_loop import AgentLoopWorker

    config = tag_agent_config(model_dir, data_file, agent_loop_yaml, response_length)
    llm = ScriptedLLM(tokenizer, script)
    handles = [reward_handle(config)] if reward_handle else None
    worker = AgentLoopWorker(config, llm, reward_loop_worker_handles=handles)
    dataset = load_dataset(data_file, tokenizer, config.data)
    return asyncio.run(worker.generate_sequences(make_batch(dataset, range(len(dataset))))), llm


def result_block(bm25_retriever, query):
    hits = bm25_retriever.search([query], research.TOPK)[0]
    return " <result>\n" + "\n\n".join(h.passage.contents for h in hits).strip() + "\n</result>"


@pytest.fixture(scope="module")
def default_run(tiny_qwen, tokenizer, data_file, bm25_server, ray_session, tmp_path_factory):
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VERL_SEARCH_URL", f"{bm25_server.url}/retrieve")
        return rollout(tiny_qwen, tokenizer, data_file, config_path("agent-loop"),
                       lambda config: ray_session.remote(RewardLoopWorker).remote(config))


def test_search_then_boxed_answer_exact_text_masks_and_reward(default_run, tokenizer, bm25_retriever):
    output, llm = default_run
    calls = calls_for(llm, GALLU["question"])
    assert len(calls) == 2
    prompt = calls[0][1]
    assert prompt.startswith("<|im_start|>system\n" + research.SYSTEM_PROMPT + "<|im_end|>\n")  # ReSearch's prompt
    assert prompt.endswith(f"<|im_start|>user\n{GALLU['question']}<|im_end|>\n<|im_start|>assistant\n")
    block = result_block(bm25_retriever, "Lilu mythology")
    assert calls[1][1] == prompt + SEARCH + block  # exactly what the model reads at turn 2
    for call in calls:
        assert call[2]["stop"] == ["</search>"]

    ids, mask = row_tokens(output, 0)
    assert [t for t, m in zip(ids, mask) if m == 1] == [t for c in calls for t in c[3]]  # token in, token out
    assert tokenizer.decode([t for t, m in zip(ids, mask) if m == 0]) == block  # only <result> is masked out
    assert ids[-1] == tokenizer.eos_token_id and mask[-1] == 1
    fields = output.non_tensor_batch
    assert fields["num_searches"][0] == 1 and fields["answered"][0] and fields["ended_with_eos"][0]
    assert fields["turns"][0][0]["query"] == "Lilu mythology"
    assert output.batch["rm_scores"][0].sum().item() == pytest.approx(1.0)
    assert fields["pred"][0] == "a spirit" and fields["format_ok"][0] == 1.0


def test_overshoot_is_cut_and_a_wrong_boxed_answer_earns_the_format_score(default_run):
    output, llm = default_run
    calls = calls_for(llm, OTHERS[0]["question"])
    kept = calls[1][1][len(calls[0][1]):]
    assert kept.startswith("<think>x</think> <search> Lilu </search> <result>\n")
    assert "invented by the model" not in kept  # the model's own <result> is gone
    assert output.batch["rm_scores"][1].sum().item() == pytest.approx(research_format_score())


def research_format_score():
    from verl_search.rewards.research import FORMAT_SCORE

    return FORMAT_SCORE


def test_searches_run_until_the_response_is_full(default_run):
    output, llm = default_run
    calls = calls_for(llm, OTHERS[1]["question"])
    ids, _ = row_tokens(output, 2)
    assert len(calls) >= 3 and len(ids) == 1500  # no turn cap: the response length ends it
    fields = output.non_tensor_batch
    assert not fields["ended_with_eos"][2] and output.batch["rm_scores"][2].sum().item() == 0.0


def test_an_answer_without_eos_scores_zero(default_run):
    output, llm = default_run
    assert len(calls_for(llm, OTHERS[2]["question"])) == 1
    fields = output.non_tensor_batch
    assert fields["answered"][3] and not fields["ended_with_eos"][3]
    assert output.batch["rm_scores"][3].sum().item() == 0.0  # ReSearch: "over length"


def test_base_prompt_search_cap_and_server_down(tiny_qwen, tokenizer, data_file, tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_SEARCH_URL", f"http://127.0.0.1:{free_port()}/retrieve")
    custom = loop_yaml(tmp_path, use_chat_template=False, max_searches=2)
    output, llm = rollout(tiny_qwen, tokenizer, data_file, custom)
    calls = calls_for(llm, GALLU["question"])
    assert calls[0][1] == tokenizer.decode(tokenizer.encode(research.base_prompt(GALLU["question"])))
    assert "<|im_start|>" not in calls[0][1]
    assert " <result>\nsearch failed: cannot connect to the retrieval service" in calls[1][1]
    assert calls[1][1].endswith("\n</result>")
    fields = output.non_tensor_batch
    assert fields["failed_searches"][0] == 1 and fields["answered"][0]
    assert len(calls_for(llm, OTHERS[1]["question"])) == 3  # 2 searches, then the turn that searched again ends it
    assert fields["num_searches"][2] == 2
