"""ReSearch's reward, case by case, written from its rules (not from its code).

Rules: `Agent-RL/ReSearch` @ 4bdb872 (branch `re-search`), `src/verl/utils/reward_score/re_search.py`:
`validate_format` lines 7-46 (think pairs l.9-13, one answer l.15-16, search/result order l.19-35,
answer order l.37-41, `\\boxed{` and `}` in the answer l.42-44), `compute_score` lines 149-179
(bad format 0 l.157-159, no EOS 0 l.161-164, box extraction errors 0 l.166-173, F1 l.175-177,
0.1 l.178-179), `get_f1_score` lines 116-147 (yes/no/noanswer only match themselves, l.126-130).

Each case is a response skeleton (valid, or breaking one named rule) around an answer (with the
F1 a reader computes by hand for its gold answers), with EOS or without. The expected score
follows from those labels alone: a broken skeleton or an answer without `\\boxed{`/`}` 0, no EOS 0,
unclosed box 0, else the F1, or 0.1 when the F1 is 0.
"""

import itertools

import pytest

from verl_search.agent_protocol.research import format_check
from verl_search.rewards import compute_score
from verl_search.rewards.research import FORMAT_SCORE, research_score

RESULT = " <result>\n\"Paris\"\nParis is the capital of France.\n\n\"France\"\nA country.\n</result>"

# (name, skeleton with {A} for the answer block's content, the rule it breaks or None)
SKELETONS = [
    ("direct", "<think> I know it. </think> <answer> {A} </answer>", None),
    ("one search", "<think> r </think> <search> capital of France </search>" + RESULT
     + " <think> r2 </think> <answer> {A} </answer>", None),
    ("two searches", "<think> a </think> <search> q1 </search>" + RESULT + " <think> b </think> <search> q2 </search>"
     + RESULT + " <think> c </think> <answer> {A} </answer>", None),
    ("search inside think", "<think> r <search> q </search>" + RESULT + " more </think> <answer> {A} </answer>", None),
    ("text after the answer", "<think> r </think> <answer> {A} </answer> Hope this helps.", None),
    ("no spaces", "<think>r</think><answer>{A}</answer>", None),
    ("two think blocks", "<think> a </think> <think> b </think> <answer> {A} </answer>", None),
    ("multi-line answer", "<think> r </think>\n<answer>\nSo:\n{A}\n</answer>", None),
    ("no think", "<answer> {A} </answer>", "<think> or </think> not found"),
    ("think never closed", "<think> r <answer> {A} </answer>", "<think> </think> not paired"),
    ("think closed twice", "<think> r </think> </think> <answer> {A} </answer>", "<think> </think> not paired"),
    ("two answers", "<think> r </think> <answer> {A} </answer> <answer> {A} </answer>",
     "<answer> or </answer> not found"),
    ("no answer", "<think> r </think> {A}", "<answer> or </answer> not found"),
    ("answer never closed", "<think> r </think> <answer> {A}", "<answer> or </answer> not found"),
    ("search without result", "<think> r </think> <search> q </search> <answer> {A} </answer>",
     "search/result tags are incomplete"),
    ("search never closed", "<think> r </think> <search> q" + RESULT + " <answer> {A} </answer>",
     "search/result tags are incomplete"),
    ("result before search", "<think> r </think>" + RESULT + " <search> q </search> <answer> {A} </answer>",
     "search/result tags are incomplete"),
    ("result never closed", "<think> r </think> <search> q </search> <result> p <answer> {A} </answer>",
     "search/result tags are incomplete"),
    ("result inside search", "<think> r </think> <search> q" + RESULT + " </search> <answer> {A} </answer>",
     "search/result tags are nested in the wrong order"),
    ("answer tags reversed", "<think> r </think> </answer> {A} <answer>", "<answer> must be before </answer>"),
]

GOLD = ["Paris", "City of Light"]
# (answer block content, golds, F1 by hand; None: no `\boxed{`/`}` (format) ; "box": a box that never closes)
ANSWERS = [
    ("\\boxed{Paris}", GOLD, 1.0),
    ("The final answer is \\[ \\boxed{Paris} \\]", GOLD, 1.0),
    ("\\boxed{the Paris}", GOLD, 1.0),  # articles dropped
    ("\\boxed{city of paris}", GOLD, 2 / 3),  # vs "paris" 0.5 (p 1/3, r 1); vs "city of light" 2/3 (p = r = 2/3)
    ("\\boxed{light}", GOLD, 0.5),  # vs "city of light": p 1, r 1/3
    ("\\boxed{Paris, France}", GOLD, 2 / 3),  # p 1/2, r 1
    ("\\boxed{London}", GOLD, 0.0),
    ("\\boxed{}", GOLD, 0.0),  # an empty answer: F1 0, well formed
    ("\\boxed{Rome} or maybe \\boxed{Paris}", GOLD, 1.0),  # the last box counts
    ("\\boxed{Paris} or maybe \\boxed{Rome}", GOLD, 0.0),
    ("\\boxed{New {York}}", ["New York"], 1.0),  # nested braces, punctuation dropped
    ("\\boxed{x} then \\boxed Paris", GOLD, 1.0),  # the `\boxed ` form wins over braces
    ("\\boxed{Paris {x}", GOLD, "box"),  # a `}` but the box never closes: extraction fails
    ("Paris", GOLD, None),  # no box at all
    ("\\boxed{Paris", GOLD, None),  # no `}` anywhere in the answer
    ("\\boxed{yes}", ["yes"], 1.0),
    ("\\boxed{no}", ["yes"], 0.0),
    ("\\boxed{yes it is}", ["yes"], 0.0),  # the gold is yes/no: only an exact yes counts
    ("\\boxed{yes}", ["yes it is"], 0.0),  # the prediction is yes/no: only an exact gold counts
    ("\\boxed{no answer}", ["noanswer"], 0.0),
]


NO_BOX = "answer is missing \\boxed{} format"


def expected(skeleton_rule, f1, eos):
    if skeleton_rule is not None or f1 is None:
        return 0.0
    if eos is False:
        return 0.0
    if f1 == "box":
        return 0.0
    return f1 if f1 > 0 else FORMAT_SCORE


CASES = [
    pytest.param(skeleton.replace("{A}", answer), golds, eos, expected(rule, f1, eos),
                 rule or (NO_BOX if f1 is None else None),
                 id=f"{name}|{answer}|{golds[0]}|eos={eos}")
    for (name, skeleton, rule), (answer, golds, f1), eos in itertools.product(SKELETONS, ANSWERS, (True, False, None))
]


def test_the_table_covers_every_rule_and_branch():
    assert len(CASES) >= 200
    rules = {case.values[4] for case in CASES}
    assert len(rules - {None}) == 7  # every reason `validate_format` can give
    scores = {case.values[3] for case in CASES}
    assert {0.0, FORMAT_SCORE, 1.0} <= scores and any(0 < s < 1 and s != FORMAT_SCORE for s in scores)


@pytest.mark.parametrize("response, golds, eos, score, rule", CASES)
def test_research_reward_agrees_with_the_rules(response, golds, eos, score, rule):
    assert research_score(response, golds, eos)[0] == pytest.approx(score)
    if rule is not None:
        assert format_check(response) == (False, rule)
    # the same through verl's entry point, with the agent loop's trajectory field
    extra = {"protocol": "research"} | ({} if eos is None else {"ended_with_eos": eos})
    assert compute_score("musique", response, {"target": golds}, extra)["score"] == pytest.approx(score)
