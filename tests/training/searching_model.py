"""A tiny random Qwen2, taught in seconds to open every assistant turn with a search.

A randomly initialised model never writes a tool call, so a training test would never see a
retrieved token. Stand-in for a real policy (none fits CI's 2 cores): the tiny model is fitted
on a handful of real prompts (the Qwen2.5 chat template, our preprocessing) to continue
`<|im_start|>assistant\\n` with `SEARCH_TURNS[protocol]`, nearly deterministically, so sampled
rollouts at temperature 1 still search. Everything after its first turn is its own noise.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.training.fit_cache import cached_fit

QUERY = "Christopher Nolan"
SEARCH_TURNS = {
    "tool": '<tool_call>\n{"name": "search", "arguments": {"query_list": ["' + QUERY + '"]}}\n</tool_call><|im_end|>',
    # the query on a line of its own: every token of the turn then follows from the one before it ('>\n' is
    # one token, '>' ends `<answer>`), which a 2-layer model fits in a few hundred steps (answering_model.py)
    "search_r1": f"<search>\n{QUERY}\n</search>",
    # ReSearch's format asks for a <think> pair before the answer; the turn stops at </search>
    "research": f"<think>\n</think>\n<search>\n{QUERY}\n</search>",
}


def _prompts(tokenizer, rows: list[dict], protocol: str, tool_schema: dict | None) -> list[list[int]]:
    prompts = []
    for row in rows:
        messages = [dict(m) for m in row["prompt"]]
        kwargs = {"tools": [tool_schema]} if protocol == "tool" and tool_schema else {}
        prompts.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs))
    return [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts]


def make_searching_model(base_folder: Path, out: Path, rows: list[dict], protocol: str,
                         tool_schema: dict | None = None, steps: int = 240, seed: int = 0) -> Path:
    """Copy of the tiny model at `base_folder`, fitted to start each turn with a search; returns `out`.

    240 steps: the tool-call turn (30 tokens) has probability 0.86 at temperature 1 after the first
    prompt (120 steps: 0.60, 17 of 32 samples whole, so 4 samples of a step all broke their call about
    once in 40 runs).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base_folder)
    model = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    target = tokenizer.encode(SEARCH_TURNS[protocol], add_special_tokens=False)
    examples = [(prompt, target) for prompt in _prompts(tokenizer, rows, protocol, tool_schema)]
    # fused: one kernel over all parameters, 34 ms a step against 172 for the loop over them (the 151k-token
    # embedding is most of the model); the same update to ~1e-7 a step (fitted move probabilities within 0.007)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
    model.train()
    for step in range(steps):
        prompt, answer = examples[step % len(examples)]
        hidden = model.model(input_ids=torch.tensor([prompt + answer])).last_hidden_state
        # the LM head (151k-token vocabulary) only where the target is predicted: 10x cheaper
        logits = model.lm_head(hidden[0, len(prompt) - 1:-1])
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(answer))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "fitted.json").write_text(json.dumps({"protocol": protocol, "final_loss": loss.item(), "steps": steps}))
    return out


def fitted_searching_model(base_folder: Path, out: Path, rows: list[dict], protocol: str) -> Path:
    """`make_searching_model` with its defaults, kept in `$VERL_SEARCH_TEST_CACHE` where it is set (a fit takes
    about a minute on 2 cores): the tests that fit the same model on the same rows share one fit."""
    steps, seed = 240, 0
    inputs = [protocol, SEARCH_TURNS[protocol], [row["prompt"] for row in rows], steps, seed,
              json.loads((Path(base_folder) / "config.json").read_text())]
    return cached_fit(f"searching_{protocol}", inputs, out,
                      lambda folder: make_searching_model(base_folder, folder, rows, protocol, steps=steps, seed=seed))
