"""A Search-R1 trajectory stays exact when verl's asynchronous trainers update the weights in the middle of it.

verl's `colocate_async` / `separate_async` trainers abort the rollout's running requests before a weight update
(`checkpoint_manager.abort_replicas`), load the new weights, and resume (`resume_generation_replicas`); verl's
`FullyAsyncLLMServerClient` (`verl/workers/rollout/llm_server.py`) re-sends an aborted turn with the tokens it had
so far, so the agent loop sees one output per turn. Here one trajectory of the fitted tiny model meets both:

* a weight update **between two generate calls** (after the search turn, before the answer turn);
* a weight update **inside one** (the answer turn aborted after at least `ABORT_AFTER` tokens, resumed on new
  weights).

Real: verl's `AgentLoopWorker` and `FullyAsyncLLMServerClient`, our agent loop from the shipped YAML (turn
settings changed), our CPU rollout server (`TransformersRolloutServer`, a local Ray actor) with its abort and
resume, the Qwen2.5 tokenizer, a BM25 retrieval server on 127.0.0.1. The test plays the trainer's part (the
abort / update / resume calls, in the order `trainer_colocate_async.py` makes them); the load balancer is a
one-server stand-in (`_acquire_server`), as the trainer's is a Ray actor over every replica.

Checked: the response's token ids, masks and observation text; every model token's rollout log-probability
equal (1e-3) to a forward pass of the weights that generated it, and not to the others; the policy versions
each turn records.
"""

import asyncio
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import MINI_QA
from tests.verl_helpers import row_tokens, tag_agent_config
from verl_search.datasets.preprocess import Source, build_rows, write_parquet
from verl_search.tools.formatting import format_results
from verl_search.verl_config.shipped import config_path

ABORT_AFTER = 8
"""Tokens the answer turn has generated when the test aborts it."""
ANSWER_TOKENS = 256
"""`max_tokens_per_turn`: the answer turn of the tiny model is noise, long enough to be caught mid-way."""
TOLERANCE = 1e-3
STEP = {1: 11, 2: 12}
"""Weight version -> the trainer's step the test sends with it (the server reports steps, as vLLM's does)."""
VERSIONS = 3
"""Weight versions: the fitted model's (0), and two with the final norm's weight scaled per channel by
`1 + 0.5 * N(0, 1)` (seeded): each version's log-probs differ from the others' by far more than `TOLERANCE`."""


def version_weights(model, version: int) -> list[tuple[str, torch.Tensor]]:
    weight = model.model.norm.weight.detach()
    if version == 0:
        return [("model.norm.weight", weight.clone())]
    noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(version))
    return [("model.norm.weight", weight * (1 + 0.5 * noise))]


@pytest.fixture(scope="module")
def searching(tiny_qwen_hd64, tmp_path_factory):
    from tests.training.searching_model import fitted_searching_model

    # the rows and fit of tests/eval/test_eval_vllm_on_cpu.py: one fit for both where the test cache is set
    rows = build_rows([Source.parse(str(MINI_QA))], "test", "search_r1", max_per_source=2, seed=0)
    out = tmp_path_factory.mktemp("partial")
    write_parquet(rows[:1], out / "rows.parquet")
    return fitted_searching_model(tiny_qwen_hd64, out / "model", rows, "search_r1"), out


@pytest.fixture(scope="module")
def aborted_run(searching, bm25_server, ray_session):
    from verl.experimental.agent_loop import AgentLoopWorker
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

    from verl_search.cpu.transformers_rollout import TransformersRolloutServer
    from verl_search.eval.batch import load_dataset, make_batch

    model_dir, out = searching
    loops = yaml.safe_load(Path(config_path("agent-loop")).read_text())
    entry = next(e for e in loops if e["name"] == "search_r1_agent")
    entry.update(max_turns=1, max_tokens_per_turn=ANSWER_TOKENS, max_obs_tokens=1000,
                 retrieval_service_url=f"{bm25_server.url}/retrieve")
    (out / "loops.yaml").write_text(yaml.safe_dump(loops))
    config = tag_agent_config(model_dir, out / "rows.parquet", out / "loops.yaml", response_length=1024)
    config.actor_rollout_ref.rollout.calculate_log_probs = True
    config.actor_rollout_ref.rollout.n = 1
    server = ray_session.remote(TransformersRolloutServer).remote(
        config=config.actor_rollout_ref.rollout, model_config=config.actor_rollout_ref.model, replica_rank=0)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    events = []

    async def update(version: int) -> None:  # trainer_colocate_async.py: on_sample_end, then on_step_end
        aborted = await server.abort_all_requests.remote()
        await server.update_weights.remote(version_weights(reference, version), global_steps=STEP[version])
        await server.resume_generation.remote()
        events.append((version, aborted["aborted_count"]))

    async def abort_inside() -> None:
        for _ in range(6000):  # 60 s at most
            if (await server.stats.remote())["batch_steps"] >= ABORT_AFTER:
                return await update(2)
            await asyncio.sleep(0.01)
        raise TimeoutError("the answer turn never reached its abort point")

    class OneServerClient(FullyAsyncLLMServerClient):
        """verl's client for partial rollout; the load balancer is this one server."""

        acquired = 0
        watcher = None

        async def _acquire_server(self, request_id, **extra):
            self.acquired += 1
            if self.acquired == 2:  # the answer turn: weights updated before it starts, then aborted inside
                await update(1)
                OneServerClient.watcher = asyncio.ensure_future(abort_inside())
            return "replica-0", server

        def _release_server(self, server_id, request_id=None):
            return None

    async def rollout():
        client = OneServerClient(config=config, load_balancer_handle=None)
        worker = AgentLoopWorker(config, client)
        dataset = load_dataset(out / "rows.parquet", AutoTokenizer.from_pretrained(model_dir), config.data)
        output = await worker.generate_sequences(make_batch(dataset, range(len(dataset))))
        await OneServerClient.watcher
        return output, client.acquired

    output, acquired = asyncio.run(rollout())
    return {"output": output, "events": events, "acquired": acquired, "reference": reference,
            "stats": ray_session.get(server.stats.remote()), "tokenizer": AutoTokenizer.from_pretrained(model_dir)}


def token_log_probs(model, version: int, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log p(response[i] | prompt, response[:i]) under weight version `version` (temperature 1)."""
    state = model.model.norm.weight.detach().clone()
    with torch.no_grad():
        model.model.norm.weight.copy_(version_weights(model, version)[0][1])
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1].float()
        model.model.norm.weight.copy_(state)
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(response)[:, None])[:, 0]


def test_the_answer_turn_was_aborted_inside_and_resumed(aborted_run):
    # update 1 found nothing running; update 2 aborted the answer turn, which the client sent again (acquisition 3)
    assert aborted_run["events"] == [(1, 0), (2, 1)]
    assert aborted_run["acquired"] == 3 and aborted_run["stats"]["weight_updates"] == 2


def test_tokens_masks_and_observation_are_what_the_rollout_produced(aborted_run, bm25_retriever):
    output, tokenizer = aborted_run["output"], aborted_run["tokenizer"]
    ids, mask = row_tokens(output, 0)
    turns = output.non_tensor_batch["turns"][0]
    assert len(turns) == 2 and turns[0]["generated"].endswith("</search>") and turns[0]["query"]
    runs = []  # (mask value, token ids) of each run: search turn, observation, answer turn
    for token, value in zip(ids, mask):
        if runs and runs[-1][0] == value:
            runs[-1][1].append(token)
        else:
            runs.append((value, [token]))
    assert [value for value, _ in runs] == [1, 0, 1]
    hits = [[{"id": h.passage.id, "contents": h.passage.contents}
             for h in bm25_retriever.search([turns[0]["query"]], 3)[0]]]
    assert tokenizer.decode(runs[1][1]) == "\n\n<information>" + format_results([turns[0]["query"]], hits)[0] + \
        "</information>\n\n" == turns[0]["observation"]
    assert tokenizer.decode(runs[2][1]) == turns[1]["generated"]
    # the resumed request was sent with what was left of the turn's budget (verl's client), so the two pieces
    # together never exceed it
    assert ABORT_AFTER < len(runs[2][1]) <= ANSWER_TOKENS


def test_each_token_has_the_log_prob_of_the_weights_that_generated_it(aborted_run):
    output, model = aborted_run["output"], aborted_run["reference"]
    ids, mask = row_tokens(output, 0)
    prompt_length = int(output.batch["attention_mask"][0, :output.batch["prompts"].shape[1]].sum())
    prompt = output.batch["prompts"][0, -prompt_length:].tolist()
    rollout = output.batch["rollout_log_probs"][0, :len(ids)]
    recomputed = {version: token_log_probs(model, version, prompt, ids) for version in range(VERSIONS)}
    model_tokens = [i for i, m in enumerate(mask) if m == 1]
    search_turn = [i for i in model_tokens if i < mask.index(0)]
    answer_turn = [i for i in model_tokens if i > mask.index(0)]

    def matches(version: int, positions: list[int]) -> list[int]:
        return [i for i in positions if abs(float(rollout[i] - recomputed[version][i])) < TOLERANCE]

    assert matches(0, search_turn) == search_turn
    assert len(set(search_turn) - set(matches(1, search_turn))) >= len(search_turn) // 2  # versions tell apart
    # the answer turn: weights 1 up to the abort, weights 2 after it, one boundary (a token both versions give
    # the same log-prob, e.g. one near probability 1, belongs to either)
    first, second = set(matches(1, answer_turn)), set(matches(2, answer_turn))
    assert first | second == set(answer_turn)
    only_first, only_second = sorted(first - second), sorted(second - first)
    assert len(only_first) + len(only_second) >= 0.8 * len(answer_turn)
    assert only_first and only_second and max(only_first) < min(only_second)
    assert answer_turn.index(min(only_second)) >= ABORT_AFTER  # the abort came after ABORT_AFTER tokens


def test_each_turn_records_the_policy_versions_it_was_generated_with(aborted_run):
    output = aborted_run["output"]
    turns = output.non_tensor_batch["turns"][0]
    # before any update the server counts updates (0); after, it reports the trainer's step of the weights
    assert [(t["min_global_steps"], t["max_global_steps"]) for t in turns] == [(0, 0), (11, 12)]
    # the trajectory's range, which verl's trainer reads for its staleness metrics
    assert (output.non_tensor_batch["min_global_steps"][0], output.non_tensor_batch["max_global_steps"][0]) == (0, 12)
    # a step training version 12: the search turn is stale, the answer turn in part (its first tokens: version 11)
    from verl_search.training.metrics import search_metrics

    stale = search_metrics([{"turns": turns}], policy_version=12)
    search, answer = turns[0]["generated_tokens"], turns[1]["generated_tokens"]
    assert stale["search/stale_tokens/share"] == pytest.approx(search / (search + answer))
    assert stale["search/stale_tokens/share_max"] == 1.0
