"""The `/retrieve` contract both ways: the server's encoder and the client's parser live next to
`RetrieveResponse` (server/schemas.py) and agree with it, in Search-R1's exact wire format."""

import orjson
import pytest

from verl_search.retrieval.base import Hit, Passage
from verl_search.server.schemas import RetrieveResponse, encode_retrieve_response, parse_retrieve_response

HITS = [[Hit(Passage("12", '"Hamlet"\nA play.'), 17.25), Hit(Passage("7", '"Paris"\nA city.'), 3.5)], []]


def test_scored_hits_are_search_r1s_format_and_parse_back():
    body = encode_retrieve_response(HITS, return_scores=True)
    assert orjson.loads(body) == {"result": [[{"document": {"id": "12", "contents": '"Hamlet"\nA play.'}, "score": 17.25},
                                              {"document": {"id": "7", "contents": '"Paris"\nA city.'}, "score": 3.5}], []]}
    RetrieveResponse.model_validate_json(body)  # the response model accepts what the route sends
    assert parse_retrieve_response(body, 2) == [[{"id": "12", "contents": '"Hamlet"\nA play.'},
                                                 {"id": "7", "contents": '"Paris"\nA city.'}], []]


def test_documents_alone_without_scores():
    body = encode_retrieve_response(HITS, return_scores=False)
    assert orjson.loads(body) == {"result": [[{"id": "12", "contents": '"Hamlet"\nA play.'},
                                              {"id": "7", "contents": '"Paris"\nA city.'}], []]}
    RetrieveResponse.model_validate_json(body)
    assert parse_retrieve_response(body, 2) == orjson.loads(body)["result"]


@pytest.mark.parametrize("body", [b"not json", b'{"result": [[]]}', b'{"detail": "x"}', b"[1]"])
def test_the_client_parser_refuses_what_is_not_an_answer_to_two_queries(body):
    with pytest.raises(ValueError):
        parse_retrieve_response(body, 2)
