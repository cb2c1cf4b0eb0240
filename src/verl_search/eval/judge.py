"""LLM-as-a-judge accuracy for `verl-search eval --judge-url URL`: an LLM decides whether each prediction
answers its question, beside EM / F1 / cover-EM (a separate column, never mixed into them).

The judge is any OpenAI-compatible chat endpoint (`POST {url}/chat/completions`: a vLLM or SGLang
server, a hosted API); the API key, if one is needed, comes from `$VERL_SEARCH_JUDGE_API_KEY`. The
prompt is ReSearch's (`Agent-RL/ReSearch`, branch `re-search`, `scripts/evaluation/llm_judge.py`,
`llm_judge_prompt`), the judgement the `judgement` field (`correct` / `incorrect`) of the JSON object
the judge writes, at temperature 0, 1,024 tokens at most, with `response_format: json_object`, as
there. A server that refuses `response_format` (HTTP 400 naming it) is asked without it for the rest
of the run; the first `{...}` of the reply is parsed.

* **Cache**: `OUT/judge_cache.jsonl`, one line per (judge model, question, gold answers, prediction):
  a rerun, or another eval with the same predictions, calls the judge only for what is not there.
* **Failures** (HTTP errors after retries, a timeout, a reply without a `correct` / `incorrect`
  judgement) are counted and reported, never scored as wrong: the record's `judge` is None and its
  `judge_error` says why; they are not cached, so a rerun asks again.
* A record without a prediction (the model never answered) is `incorrect` without a call.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
from pathlib import Path

logger = logging.getLogger(__name__)

API_KEY_ENV = "VERL_SEARCH_JUDGE_API_KEY"
JUDGEMENTS = ("correct", "incorrect")

#: ReSearch's judge prompt, verbatim (`llm_judge_prompt`); `{gt_answer}` is the Python list of gold answers
JUDGE_PROMPT = (
    "You will be given a question and its ground truth answer list where each item can be a ground truth answer. "
    "Provided a pred_answer, you need to judge if the pred_answer correctly answers the question based on the "
    "ground truth answer list. "
    "You should first give your rationale for the judgement, and then give your judgement result (i.e., correct or "
    "incorrect).\n\n"
    "Here is the criteria for the judgement:\n"
    "1. The pred_answer doesn't need to be exactly the same as any of the ground truth answers, but should be "
    "semantically same for the question.\n"
    "2. Each item in the ground truth answer list can be viewed as a ground truth answer for the question, and the "
    "pred_answer should be semantically same to at least one of them.\n\n"
    "question: {question}\n"
    "ground truth answers: {gt_answer}\n"
    "pred_answer: {pred_answer}\n\n"
    "The output should in the following json format:\n"
    "```json \n"
    "{{\n"
    '    "rationale": "your rationale for the judgement, as a text",\n'
    "    \"judgement\": \"your judgement result, can only be 'correct' or 'incorrect'\"\n"
    "}}\n"
    "```\n\n"
    "Your output:"
)
_OBJECT_RE = re.compile(r"\{.*\}", re.DOTALL)


def cache_key(model: str, question: str, golds: list[str], prediction: str) -> str:
    """The cache key of one judgement: a hash of the judge model and what it is shown."""
    return hashlib.sha256(json.dumps([model, question, list(golds), prediction]).encode()).hexdigest()


def parse_judgement(reply: str) -> tuple[str | None, str]:
    """`(judgement, rationale)` from a judge's reply; judgement None when the reply holds no JSON object
    whose `judgement` is `correct` or `incorrect` (the rationale then says what was wrong).

    >>> parse_judgement('```json {"rationale": "same city", "judgement": "Correct"} ```')
    ('correct', 'same city')
    >>> parse_judgement("I think it is right.")[0] is None
    True
    """
    match = _OBJECT_RE.search(reply)
    try:
        verdict = json.loads(match.group(0)) if match else None
    except json.JSONDecodeError:
        verdict = None
    if not isinstance(verdict, dict):
        return None, f"no JSON object in the reply: {reply[:200]!r}"
    judgement = str(verdict.get("judgement", "")).strip().lower()
    if judgement not in JUDGEMENTS:
        return None, f"judgement {verdict.get('judgement')!r} is neither correct nor incorrect"
    return judgement, str(verdict.get("rationale", ""))


async def _ask(client, url: str, model: str, prompt: str, retries: int, json_mode: dict) -> str:
    """The judge's reply text; raises the last error after `retries` retries (HTTP 5xx and transport errors).
    `json_mode["on"]`: ask for `response_format: json_object`; turned off for good on a 400 that names it."""
    import httpx

    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 1024}
    for attempt in range(retries + 1):
        try:
            extra = {"response_format": {"type": "json_object"}} if json_mode["on"] else {}
            response = await client.post(f"{url.rstrip('/')}/chat/completions", json={**body, **extra})
            if response.status_code == 400 and extra and "response_format" in response.text:
                if json_mode["on"]:
                    logger.warning("the judge refuses response_format json_object; asking without it")
                json_mode["on"] = False
                response = await client.post(f"{url.rstrip('/')}/chat/completions", json=body)
            if response.status_code >= 500 and attempt < retries:
                await asyncio.sleep(0.5 * 2 ** attempt)
                continue
            response.raise_for_status()
            return response.json()["choices"][0]["message"]["content"] or ""
        except (httpx.TransportError, httpx.TimeoutException):
            if attempt == retries:
                raise
            await asyncio.sleep(0.5 * 2 ** attempt)
    raise RuntimeError("unreachable")


def judge_records(records: list[dict], url: str, model: str, cache_path: Path, *, concurrency: int = 8,
                  timeout: float = 120.0, retries: int = 2) -> dict[str, int]:
    """Add `judge` (`"correct"`, `"incorrect"` or None for a failure) and `judge_error` to every record.

    Args:
        records: `trajectories.jsonl` records (`question`, `golden_answers`, `prediction`); changed in place.
        url: the endpoint's base URL (`http://host:8000/v1`).
        model: the model name the endpoint serves.
        cache_path: the judgement cache (JSON lines; created, appended).
        concurrency: judge requests in flight; timeout: seconds per request; retries: per request.

    Returns:
        `{"called", "cached", "unanswered", "failed"}` counts.
    """
    import httpx

    cached = {}
    if cache_path.is_file():
        for line in cache_path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                entry = json.loads(line)
                cached[entry["key"]] = entry
    counts = {"called": 0, "cached": 0, "unanswered": 0, "failed": 0}
    todo = []
    for record in records:
        record["judge"], record["judge_error"] = None, None
        if not record.get("prediction"):
            record["judge"] = "incorrect"
            counts["unanswered"] += 1
            continue
        key = cache_key(model, record["question"], record["golden_answers"], record["prediction"])
        if key in cached:
            record["judge"] = cached[key]["judgement"]
            counts["cached"] += 1
        else:
            todo.append((key, record))

    async def run() -> None:
        gate = asyncio.Semaphore(concurrency)
        json_mode = {"on": True}
        headers = {"Authorization": f"Bearer {os.environ[API_KEY_ENV]}"} if os.environ.get(API_KEY_ENV) else {}
        async with httpx.AsyncClient(timeout=timeout, headers=headers) as client:
            async def one(key: str, record: dict) -> None:
                prompt = JUDGE_PROMPT.format(question=record["question"], gt_answer=str(list(record["golden_answers"])),
                                             pred_answer=record["prediction"])
                async with gate:
                    try:
                        reply = await _ask(client, url, model, prompt, retries, json_mode)
                    except Exception as exc:  # any failure is counted, never scored
                        record["judge_error"] = f"{type(exc).__name__}: {exc}"[:300]
                        return
                judgement, rationale = parse_judgement(reply)
                if judgement is None:
                    record["judge_error"] = rationale
                    return
                record["judge"] = judgement
                with cache_path.open("a", encoding="utf-8") as file:
                    file.write(json.dumps({"key": key, "model": model, "question": record["question"],
                                           "prediction": record["prediction"], "judgement": judgement,
                                           "rationale": rationale}) + "\n")

            await asyncio.gather(*(one(key, record) for key, record in todo))

    if todo:
        asyncio.run(run())
    counts["called"] = len(todo)
    counts["failed"] = sum(record["judge_error"] is not None for _, record in todo)
    if counts["failed"]:
        logger.warning("the judge failed on %d of %d predictions (not scored; a rerun asks again): first: %s",
                       counts["failed"], len(todo), next(r["judge_error"] for _, r in todo if r["judge_error"]))
    return counts
