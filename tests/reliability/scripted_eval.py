"""`verl-search eval` (the real CLI entry, `verl_search.cli.main`) with `ScriptedLLM` standing in
for the GPU engine: a child process for the kill tests (`test_eval_resume_after_kill_on_cpu.py`).

    python -m tests.reliability.scripted_eval MODEL_DIR KILL -- eval --data ... --out ...

KILL: `none`; `question:N` (SIGKILL itself when the Nth distinct question reaches the engine);
`write:N` (SIGKILL itself half-way through writing the Nth batch to trajectories.jsonl).
"""

from __future__ import annotations

import json
import os
import signal
import sys

from tests.conftest import MINI_QA

QA = [json.loads(line) for line in MINI_QA.read_text().splitlines()]
GOLD = {row["question"]: row["golden_answers"][0] for row in QA}


def question_of(prompt_text: str) -> str:
    return next(q for q in GOLD if q in prompt_text)


def script(prompt_text: str, turn: int) -> str:
    """Deterministic (as greedy decoding is): search the question, then answer (right for hotpotqa)."""
    question = question_of(prompt_text)
    if turn == 0:
        return f"<think>look it up</think><search> {question} </search>"
    source = next(row["source"] for row in QA if row["question"] == question)
    return f"<think>done</think><answer> {GOLD[question] if source == 'hotpotqa' else 'wrong'} </answer>"


def killing_script(after: int):
    seen: list[str] = []

    def run(prompt_text: str, turn: int) -> str:
        question = question_of(prompt_text)
        if question not in seen:
            seen.append(question)
            if len(seen) == after:
                os.kill(os.getpid(), signal.SIGKILL)
        return script(prompt_text, turn)

    return run


class TearingFile:
    """A file whose `nth` write stops half-way: the first half reaches the disk, then SIGKILL."""

    def __init__(self, file, nth: int):
        self.file, self.nth, self.writes = file, nth, 0

    def write(self, data: str) -> int:
        self.writes += 1
        if self.writes == self.nth:
            self.file.write(data[: len(data) // 2])
            self.file.flush()
            os.fsync(self.file.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.file.__exit__(*exc)


def main() -> int:
    model_dir, kill, _, *argv = sys.argv[1:]
    from transformers import AutoTokenizer

    from tests.verl_helpers import ScriptedLLM
    from verl_search.cli import main as cli_main
    from verl_search.eval import harness, verl_run

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    mode, _, number = kill.partition(":")
    llm = ScriptedLLM(tokenizer, killing_script(int(number)) if mode == "question" else script)
    harness.make_engine = lambda options: (llm, tokenizer, model_dir)
    if mode == "write":
        verl_run.open = lambda *a, **k: TearingFile(open(*a, **k), int(number))
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
