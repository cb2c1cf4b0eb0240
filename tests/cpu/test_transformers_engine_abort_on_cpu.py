"""`TransformersEngine.abort` / `resume`, the partial rollout of the CPU rollout server, on the tiny random Qwen2:
an aborted greedy turn resumed from its tokens so far (as verl's `FullyAsyncLLMServerClient` resends it) gives the
uninterrupted turn's tokens and log-probs; requests that arrive while paused wait for `resume`, or are answered
`aborted` at once with `reject=True`."""

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_search.llm.engines import ABORTED, TransformersEngine

PROMPT = "Who directed the film Inception?"
PARAMS = {"max_tokens": 64, "temperature": 0.0, "logprobs": True}


@pytest.fixture(scope="module")
def engine(tiny_qwen):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen, dtype=torch.float32)
    return TransformersEngine(model, tokenizer, max_batch_size=4), tokenizer.encode(PROMPT)


async def _abort_when(engine: TransformersEngine, steps: int, reject: bool = False) -> int:
    while engine.batch_steps < steps:
        await asyncio.sleep(0.001)
    return await engine.abort(reject=reject)


def test_an_aborted_turn_resumed_from_its_tokens_equals_the_uninterrupted_turn(engine):
    engine, prompt = engine

    async def run():
        whole = await engine.generate("a", prompt_ids=prompt, sampling_params=PARAMS)
        first = asyncio.ensure_future(engine.generate("b", prompt_ids=prompt, sampling_params=PARAMS))
        aborted = await _abort_when(engine, 8)
        part = await first
        engine.resume()
        rest = await engine.generate("b", prompt_ids=prompt + part.token_ids,
                                     sampling_params={**PARAMS, "max_tokens": 64 - len(part.token_ids)})
        return whole, aborted, part, rest

    whole, aborted, part, rest = asyncio.run(run())
    assert whole.stop_reason == "completed" and len(whole.token_ids) == 64  # a random model writes no EOS here
    assert aborted == 1 and part.stop_reason == ABORTED and 8 <= len(part.token_ids) < 64
    assert part.token_ids + rest.token_ids == whole.token_ids
    assert part.log_probs + rest.log_probs == pytest.approx(whole.log_probs, abs=1e-4)
    assert part.extra_fields["weight_version"] == rest.extra_fields["weight_version"] == 0


def test_requests_wait_while_paused_and_reject_answers_them_at_once(engine):
    engine, prompt = engine

    async def run():
        assert await engine.abort() == 0  # nothing running: pauses all the same
        waiting = asyncio.ensure_future(engine.generate("c", prompt_ids=prompt, sampling_params=PARAMS))
        await asyncio.sleep(0.3)
        held = not waiting.done()
        engine.resume()
        answered = await waiting
        await engine.abort(reject=True)
        rejected = await engine.generate("d", prompt_ids=prompt, sampling_params=PARAMS)
        engine.resume()
        return held, answered, rejected

    held, answered, rejected = asyncio.run(run())
    assert held and answered.stop_reason == "completed" and len(answered.token_ids) == 64
    assert rejected.stop_reason == ABORTED and rejected.token_ids == []
