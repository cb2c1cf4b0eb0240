"""Where the answers were lost (issue 50: the report says at which step a model fails: retrieval, the observation's
cut, extraction): each question at the first step it failed, with "in the full top-k passages" read by replaying the
recorded queries on a real BM25 index; on hand-written records over a four-passage corpus, and on the default run's
kept evaluations (`tests/assets/runs/quickstart_run/`) replayed on the mini-wiki index the quickstart builds."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.quickstart.test_report_metrics_on_cpu import RUN, record
from verl_search.report.funnel import (
    FILE,
    funnel,
    funnel_section,
    funnel_table,
    gold_in_top_k,
    read_gold_in_top_k,
    same_queries,
    step_of,
    where_it_fails,
    write_gold_in_top_k,
)
from verl_search.report.quickstart import main as rerender_main, write_report

PASSAGES = {
    "Paris": "Paris is the capital of France.",
    "Lyon": "Lyon is a city in France. " + "It has old streets and many bridges. " * 12 + "Its river is the Rhone.",
    "Oslo": "Oslo is the capital of Norway.",
    "Bergen": "Bergen is a port city in Norway.",
}


def observation(titles: list[str], cut_at: int | None = None) -> str:
    """An observation as the agent loop records it: the passages in Search-R1's format, cut after `cut_at`
    characters (then the truncation mark)."""
    text = "\n".join(f'Doc {i + 1}(Title: "{t}") {PASSAGES[t]}' for i, t in enumerate(titles))
    if cut_at is not None:
        text = text[:cut_at] + " ...(truncated)"
    return f"\n\n<information>{text}</information>\n\n"


def records() -> list[dict]:
    failed = record("g", ["Bergen"], "", [("port city Norway", "search failed: 503")])
    failed["turns"][0]["search_failed"] = True
    return [
        record("a", ["Paris"], "Paris", [("capital of France", observation(["Paris", "Lyon"]))]),  # right
        record("b", ["Rhone"], "Seine", [("Lyon river", observation(["Lyon", "Paris"], cut_at=200))]),  # cut
        record("c", ["Oslo"], "Bergen", [("capital of Norway", observation(["Oslo", "Bergen"]))]),  # misread
        record("d", ["Tokyo"], "Kyoto", [("capital of Japan", observation(["Paris", "Oslo"]))]),  # not retrieved
        record("e", ["Madrid"], "Madrid", [("capital of Spain", observation(["Paris", "Oslo"]))]),  # a guess
        record("f", ["Oslo"], "Oslo", []),  # no search: a right guess too
        failed,  # every search failed: no search
    ]


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    from verl_search.retrieval.index_builder import BuildOptions, build_index
    from verl_search.retrieval.loader import resolve_index

    folder = tmp_path_factory.mktemp("funnel")
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"{title}"\n{text}'}) + "\n"
                              for i, (title, text) in enumerate(PASSAGES.items())))
    build_index(corpus, folder / "index", BuildOptions(retriever="bm25", overwrite=True))
    return folder / "index", resolve_index(folder / "index").load()


def test_each_question_stops_at_the_first_step_it_failed(retriever):
    index, bm25 = retriever
    replay = gold_in_top_k(records(), bm25, topk=2)
    # b's gold is in Lyon's full passage, which its observation cut; d's and e's gold is in no passage at all
    assert replay["questions"] == {"a": True, "b": True, "c": True, "d": False, "e": False, "f": None, "g": None}
    assert replay["searches"] == 5 and replay["topk"] == 2
    # the replay's top passage is the recorded one where the records show what BM25 ranks first
    ranked = [bm25.search([q], 2)[0][0].passage.title for q in ("capital of France", "Lyon river", "capital of Norway")]
    assert ranked == ["Paris", "Lyon", "Oslo"]
    assert (replay["first_passages"], replay["first_passage_matches"]) == (5, 3)  # d and e recorded another top
    assert [step_of(r, replay["questions"][r["id"]]) for r in records()] == \
        ["right", "cut", "misread", "not_retrieved", "not_retrieved", "no_search", "no_search"]
    f = funnel(records(), replay)
    assert f == {"n": 7, "no_search": 2, "not_retrieved": 2, "cut": 1, "misread": 1, "right": 1, "right_unseen": 2,
                 "lost_most": "no_search"}  # a tie of two goes to the earlier step
    assert sum(f[step] for step in ("no_search", "not_retrieved", "cut", "misread", "right")) == f["n"]
    assert "| cold_start | 7 | 2 | 2 | 1 | 1 | 1 | 2 | no_search | 3 of 5 |" in funnel_table({"cold_start": f},
                                                                                            {"cold_start": replay})
    with pytest.raises(ValueError, match="got none"):
        funnel([], replay)


def test_a_gold_the_model_saw_counts_as_retrieved_and_one_the_replay_misses_as_not():
    # no retriever answers here: the replay's verdicts are given, the record's own observation decides visibility
    seen = record("a", ["Paris"], "Paris", [("capital of France", observation(["Paris"]))])
    assert step_of(seen, False) == "right"  # what the model read outranks the replay
    assert funnel([seen], {"questions": {}})["not_retrieved"] == 0
    unseen = record("b", ["Rhone"], "x", [("Lyon river", observation(["Lyon"], cut_at=100))])
    assert funnel([unseen], {"questions": {}})["not_retrieved"] == 1  # missing from the replay: not retrieved
    # the tool's own words for an empty search do not show a gold "no"
    empty = record("c", ["no"], "yes", [("and", "\n\n<information>No passages found.</information>\n\n")])
    assert step_of(empty, False) == "not_retrieved"


def test_the_sentences_name_the_failing_step_and_what_grpo_changed(retriever):
    _, bm25 = retriever
    start = records()
    # GRPO: the same searches, c now read right; d searched another query (and still found nothing)
    grpo = [dict(r, prediction="Oslo", em=1.0, f1=1.0) if r["id"] == "c" else r for r in records()]
    grpo[3] = record("d", ["Tokyo"], "Kyoto", [("Japan capital city", observation(["Paris", "Oslo"]))])
    assert same_queries(start, grpo) == 6
    replays = {"cold_start": gold_in_top_k(start, bm25, 2), "grpo": gold_in_top_k(grpo, bm25, 2)}
    funnels = {m: funnel(rows, replays[m]) for m, rows in (("cold_start", start), ("grpo", grpo))}
    subset = {"n": 3, "comparisons": {"cold_start -> grpo: f1": {"mean_diff": 1 / 3, "ci95": [0.0, 1.0]},
                                      "cold_start -> grpo: em": {"mean_diff": 1 / 3, "ci95": [0.0, 1.0]},
                                      "grpo_control -> grpo: f1": {"mean_diff": 0.5, "ci95": [0.1, 0.9]}}}
    lines = where_it_fails(funnels, {"cold_start": start, "grpo": grpo}, "cold_start", subset)
    assert lines[0] == ("- cold_start loses most questions at searching (no search, or every search failed): 2 of 7; "
                        "1 reach a right answer with the gold visible, 2 more without it.")
    assert lines[1] == ("- grpo searched exactly cold_start's queries on 6 of 7 questions, so its retrieval and cut "
                        "can differ from cold_start's on 1 questions at most; by step: no search 2 -> 2, not retrieved "
                        "2 -> 2, cut 1 -> 1, misread 1 -> 0, right 1 -> 2. On the 3 questions whose gold cold_start "
                        "saw, F1 cold_start -> grpo +0.333 [+0.000, +1.000], including 0; grpo_control -> grpo "
                        "+0.500 [+0.100, +0.900], above 0.")
    assert where_it_fails(funnels, {}, None, None) == []
    # the untrained model before the start is not compared with it
    assert len(where_it_fails({"untrained": funnels["grpo"], **funnels}, {"cold_start": start, "grpo": grpo},
                              "cold_start", None)) == 2


def test_the_report_shows_the_section_only_with_the_replays(tmp_path, retriever):
    index, _ = retriever
    for name, rows in (("cold_start", records()), ("grpo", records())):
        (tmp_path / "eval" / name).mkdir(parents=True)
        (tmp_path / "eval" / name / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    models = {"cold_start": records(), "grpo": records()}
    report = write_report(tmp_path, models, {}, {}, {"title": "t"}, samples=200)
    text = (tmp_path / "report.md").read_text()
    assert report["funnel"] == {} and "Not replayed: no evaluation has its `gold_in_top_k.json`" in text
    assert funnel_section({}, {}, None, None)[0] == {}
    written = write_gold_in_top_k(tmp_path, index, 2)
    assert sorted(written) == ["cold_start", "grpo"] and (tmp_path / "eval" / "grpo" / FILE).is_file()
    assert read_gold_in_top_k(tmp_path, ["cold_start", "grpo", "untrained"]) == written
    report = write_report(tmp_path, models, {}, {}, {"title": "t"}, samples=200)
    text = (tmp_path / "report.md").read_text()
    assert report["funnel"]["grpo"]["cut"] == 1 and "## Where the answers were lost" in text
    assert "full top-2 passages" in text and "- grpo searched exactly cold_start's queries on 7 of 7" in text
    assert write_gold_in_top_k(tmp_path / "nothing", index, 2) == {}


def test_the_kept_run_replays_on_the_quickstart_index(tmp_path, bm25_index):
    """The default run's kept evaluations replayed on the mini-wiki BM25 index (the corpus the quickstart indexes):
    every first search's top passage is the one the run recorded, so the index reproduces the run's searches."""
    out = tmp_path / "run"
    shutil.copytree(RUN, out)
    old = json.loads((out / "report.json").read_text())
    old["meta"]["options"]["bootstrap_samples"] = 200
    (out / "report.json").write_text(json.dumps(old))
    rerender_main([str(out), "--index", str(bm25_index)])
    report = json.loads((out / "report.json").read_text())
    replays = read_gold_in_top_k(out, ["untrained", "cold_start", "grpo"])
    assert sorted(replays) == ["cold_start", "grpo", "untrained"]
    assert all(r["topk"] == old["meta"]["options"]["topk"] for r in replays.values())
    for model in ("cold_start", "grpo"):
        assert replays[model]["first_passages"] > 90
        assert replays[model]["first_passage_matches"] == replays[model]["first_passages"]
        f = report["funnel"][model]
        assert f["n"] == 102 and f["right"] + f["misread"] == round(report["conditional"][model]["gold_visible"] * 102)
        assert f["not_retrieved"] > f["cut"] > 0  # most questions are lost at retrieval in the kept run
        assert f["lost_most"] == "not_retrieved"
    assert "## Where the answers were lost" in (out / "report.md").read_text()
