"""`eval.records.queries_of`: the queries a model turn asked, read with the search tool's own parser."""

import pytest

from verl_search.eval.records import queries_of


@pytest.mark.parametrize("text, expected", [
    # the tag protocol: the <search> block
    ("<think>x</think><search>who wrote Hamlet</search>", ["who wrote Hamlet"]),
    # a hermes call of the search tool: query_list, stripped as the tool strips it
    ('<tool_call>{"name": "search", "arguments": {"query_list": [" a ", "b"]}}</tool_call>', ["a", "b"]),
    # the single-query form the tool accepts too
    ('<tool_call>{"name": "search", "arguments": {"query": "c"}}</tool_call>', ["c"]),
    # another tool's call (the access tool) asks no query
    ('<tool_call>{"name": "access", "arguments": {"ids": ["1"]}}</tool_call>', []),
    # a call the tool refuses (a non-string query, a blank one) searched nothing
    ('<tool_call>{"name": "search", "arguments": {"query_list": ["a", 3]}}</tool_call>', []),
    ('<tool_call>{"name": "search", "arguments": {"query_list": [" "]}}</tool_call>', []),
    # broken JSON, then a good call: only the good one counts
    ('<tool_call>{"name": </tool_call><tool_call>{"name": "search", "arguments": {"query_list": ["d"]}}</tool_call>',
     ["d"]),
])
def test_queries_of(text, expected):
    assert queries_of(text) == expected
