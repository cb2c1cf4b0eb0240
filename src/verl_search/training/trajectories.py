"""A search-then-answer trajectory as the agent loop builds it, token for token: the prompt through verl's
Continuous Token builder, the model's search turn, the observation of the retriever's passages framed and cut as
`SearchR1AgentLoop` (or `ReSearchAgentLoop`) frames and cuts it, an optional second search, then the answer turn;
and what the model reads of it (`observation_text`, `gold_visible`). The cold start trains on these
(`training.cold_start`), and selects them by what the model would see (`training.second_hop` too).
"""

from __future__ import annotations

SEARCH_TURN = "<think> I need to look this up. </think>\n<search> {question} </search>"
ANSWER_TURN = "<think> The passages answer it. </think>\n<answer> {answer} </answer>"
#: the model turn of a second search (`training.second_hop`): a page the first observation names
SECOND_SEARCH_TURN = ("<think> The passages do not answer it. I need to look up {query}. </think>\n"
                      "<search> {query} </search>")
RESEARCH_SEARCH_TURN = "<think> I need to look this up. </think> <search> {question} </search>"
RESEARCH_ANSWER_TURN = " <think> The passages answer it. </think> <answer> \\boxed{{{answer}}} </answer>"


def observation_text(ids: list[int], mask: list[int], tokenizer) -> str:
    """The observation of a trajectory (`trajectory_tokens`) as the model reads it: its tokens with `loss_mask`
    0 after the first model token, decoded as the agent loop decodes them (`skip_special_tokens=False`)."""
    first = mask.index(1) if 1 in mask else len(mask)
    return tokenizer.decode([t for t, m in zip(ids[first:], mask[first:]) if m == 0], skip_special_tokens=False)


def gold_visible(row: dict, ids: list[int], mask: list[int], tokenizer) -> bool:
    """Whether a gold answer of `row` is visible in the observation of its trajectory `(ids, mask)`
    (`observation_text`; `rewards.qa.answer_in_observation`: whole words, normalised, the frame's own words
    left out): the check the evaluation reports apply to the agent loop's recorded observations."""
    from verl_search.rewards.qa import answer_in_observation

    return answer_in_observation(observation_text(ids, mask, tokenizer),
                                 row["reward_model"]["ground_truth"]["target"])


def trajectory_tokens(row: dict, hits: list, tokenizer, builder, *, max_turns: int, max_obs_tokens: int,
                      response_length: int, min_tokens_after_observation: int = 64, protocol: str = "search_r1",
                      end_ids: list[int] | None = None, last_search_notice: bool = False,
                      second: tuple[str, list] | None = None) -> tuple[list[int], list[int]]:
    """`(input_ids, loss_mask)` of one search-then-answer trajectory (prompt + response), built with the agent
    loops' own builder (`agent_protocol.trajectory.ResponseTokens`) and observation functions
    (`tools.formatting.information_tokens`, `agent_protocol.research.passages_result_tokens`).

    Args:
        row: a verl row of the tag protocol (`prompt`, `extra_info.question`, `reward_model`).
        hits: the retriever's hits for the question (`Hit`: `.passage.id`, `.passage.contents`).
        tokenizer, builder: the model's tokenizer and `prompt_builder`.
        max_turns, max_obs_tokens, response_length, min_tokens_after_observation, last_search_notice: the
            agent loop's settings (they decide the last-search notice and the observation's length).
        protocol: `search_r1` (default) or `research` (see the module docstring).
        end_ids: `research`: the model's end-of-sequence token ids (`llm.models.end_of_sequence_ids`;
            the first ends the answer turn).
        second: `(query, hits)` of a second search (`search_r1` only; `training.second_hop`): the model turn
            `SECOND_SEARCH_TURN` and its observation come between the first observation and the answer.

    Returns two lists of equal length; `loss_mask` is 1 on the model turns only.

    Raises:
        ValueError: `max_turns` is 0 (the protocol allows no search), or `second` with `max_turns` below 2 or
            the `research` protocol.
    """
    from verl_search.agent_protocol.trajectory import ResponseTokens
    from verl_search.agent_protocol.vocabulary import LAST_SEARCH_NOTICE
    from verl_search.tools.formatting import information_tokens

    if max_turns < 1:
        raise ValueError(f"max_turns={max_turns}: a search-then-answer trajectory needs max_turns >= 1")
    if second is not None and (max_turns < 2 or protocol != "search_r1"):
        raise ValueError(f"a second search needs max_turns >= 2 and the search_r1 protocol, got max_turns={max_turns}, "
                         f"protocol={protocol!r}")

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    prompt = list(builder.build_initial_tokens([dict(m) for m in row["prompt"]]))
    question = row["extra_info"]["question"].strip()
    gold = row["reward_model"]["ground_truth"]["target"][0]
    documents = [{"id": h.passage.id, "contents": h.passage.contents} for h in hits]
    response = ResponseTokens(response_length)
    if protocol == "research":
        from verl_search.agent_protocol import research

        # ReSearchAgentLoop: no room kept after a result (its min_tokens_after_observation is 0)
        response.add_model_turn(encode(RESEARCH_SEARCH_TURN.format(question=question)))
        response.add_observation(research.passages_result_tokens(documents, encode,
                                                                 response.observation_budget(max_obs_tokens))[0])
        end = (end_ids or [tokenizer.eos_token_id])[:1]
        response.add_model_turn(encode(RESEARCH_ANSWER_TURN.format(answer=gold)) + end)
    else:
        searches = [(SEARCH_TURN.format(question=question), question, documents)]
        if second is not None:
            query, second_hits = second
            searches.append((SECOND_SEARCH_TURN.format(query=query), query,
                             [{"id": h.passage.id, "contents": h.passage.contents} for h in second_hits]))
        for turn, (text, query, docs) in enumerate(searches):  # as SearchR1AgentLoop._observe renders each one
            notice = LAST_SEARCH_NOTICE if turn == max_turns - 1 and last_search_notice else ""
            response.add_model_turn(encode(text))
            budget = response.observation_budget(max_obs_tokens, min_tokens_after_observation)
            response.add_observation(information_tokens(query, docs, encode, budget, notice)[0])
        response.add_model_turn(encode(ANSWER_TURN.format(answer=gold)))
    return prompt + response.response_ids, [0] * len(prompt) + response.mask
