"""`trajectories.jsonl`: one record per question, from an agent-loop output batch, scored with
`verl_search.rewards.compute_score` as verl's reward loop would score it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from verl_search.eval.rows import row_id
from verl_search.agent_protocol.tool import parse_queries
from verl_search.agent_protocol.vocabulary import (
    ENDED_WITH_EOS,
    FAILED_SEARCHES,
    INVALID_ACTIONS,
    NUM_SEARCHES,
    SEARCH_ERRORS,
    SEARCH_TOOL,
    TOOL_CALL_RE,
    TURNS,
    parse_action,
)
from verl_search.rewards import compute_score, gold_answers


def _turns_from_tokens(ids: list[int], mask: list[int], decode) -> list[dict]:
    """Model turns (mask 1) with the observation (mask 0) that followed each, decoded from the tokens."""
    turns: list[dict] = []
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or mask[end] != mask[start]:
            text = decode(ids[start:end])
            if mask[start] == 1:
                turns.append({"generated": text, "queries": queries_of(text)})
            elif turns:
                turns[-1]["observation"] = text
            start = end
    return turns


def _turns_from_agent_loop(recorded: list[dict]) -> list[dict]:
    """The tag-protocol agent loop's own turn records, with `queries` as a list."""
    turns = []
    for turn in recorded:
        turn = dict(turn)
        query = turn.pop("query", None)
        turns.append({**turn, "queries": [query] if query is not None else queries_of(turn["generated"])})
    return turns


def queries_of(text: str) -> list[str]:
    """The search queries of one model turn: a `<search>` block, or the queries of its hermes calls of
    the search tool, parsed as the tool parses them (`agent_protocol.tool.parse_queries`; a call the
    tool refuses searched nothing, so it adds none)."""
    action = parse_action(text)
    if action.kind == "search":
        return [action.content]
    queries = []
    for body in TOOL_CALL_RE.findall(text):
        try:
            call = json.loads(body)
            if call.get("name", SEARCH_TOOL) == SEARCH_TOOL:
                queries += parse_queries(call.get("arguments", {}))
        except (ValueError, AttributeError):
            continue
    return queries


def _field(output, key: str, position: int):
    return output.non_tensor_batch[key][position] if key in output.non_tensor_batch else None


def trajectory_record(output, position: int, row: dict, tokenizer) -> dict:
    """One `trajectories.jsonl` line for row `position` of an agent-loop output batch (`DataProto`).

    `turns` come from the agent loop's own record when it keeps one (`SearchR1AgentLoop`), else
    they are decoded from the response tokens and mask (`ToolAgentLoop`).
    """
    prompt_width = output.batch["prompts"].shape[1]
    valid = int(output.batch["attention_mask"][position, prompt_width:].sum())
    ids = output.batch["responses"][position, :valid].tolist()
    mask = output.batch["response_mask"][position, :valid].tolist()
    fields = {}
    for key in (NUM_SEARCHES, FAILED_SEARCHES, SEARCH_ERRORS, INVALID_ACTIONS, ENDED_WITH_EOS):
        value = _field(output, key, position)
        if value is not None:
            fields[key] = value if key == SEARCH_ERRORS else bool(value) if key == ENDED_WITH_EOS else int(value)
    extra_info = {**row["extra_info"], **fields}
    response = tokenizer.decode(ids, skip_special_tokens=True)  # what verl's reward manager decodes
    score = compute_score(row["data_source"], response, row["reward_model"]["ground_truth"], extra_info)
    recorded = _field(output, TURNS, position)
    turns = (_turns_from_agent_loop(list(recorded)) if recorded is not None
             else _turns_from_tokens(ids, mask, lambda t: tokenizer.decode(t, skip_special_tokens=False)))
    return {
        "id": row_id(row), "data_source": row["data_source"], "question": row["extra_info"].get("question"),
        "golden_answers": gold_answers(row["reward_model"]["ground_truth"]), "prediction": score["pred"],
        "em": score["acc"], "f1": score["f1"], "cover_em": score["cover_em"], "score": score["score"],
        "format_ok": score["format_ok"], "answered": bool(score["answered"]), NUM_SEARCHES: score[NUM_SEARCHES],
        FAILED_SEARCHES: score[FAILED_SEARCHES], SEARCH_ERRORS: list(fields.get(SEARCH_ERRORS) or []),
        INVALID_ACTIONS: fields.get(INVALID_ACTIONS, 0), ENDED_WITH_EOS: fields.get(ENDED_WITH_EOS),
        "generated_tokens": int(sum(mask)),
        "response_tokens": len(ids), TURNS: turns,
    }


def repair_trajectories(path: Path) -> int:
    """Cut a torn tail off `trajectories.jsonl` (a run killed while writing a batch); return the bytes cut.

    Batches are appended and fsynced whole, so only the last line can be incomplete: everything
    after the last newline goes, and the questions it held are rolled out again on resume.
    """
    if not path.is_file():
        return 0
    size = path.stat().st_size
    with open(path, "rb+") as file:
        end = size
        while end > 0:
            file.seek(max(0, end - 65536))
            block = file.read(end - max(0, end - 65536))
            newline = block.rfind(b"\n")
            if newline >= 0:
                end = max(0, end - len(block)) + newline + 1
                break
            end = max(0, end - len(block))
        if end < size:
            file.truncate(end)
            file.flush()
            os.fsync(file.fileno())
    return size - end

