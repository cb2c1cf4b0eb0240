"""verl-search: train and evaluate search agents (Search-R1) on verl.

Subpackages follow the data flow: `retrieval` (corpus, BM25/dense retrievers, index builder) ->
`server` (the `/retrieve` HTTP service) -> `tools` (verl `SearchTool`) and `agent_loop`
(Search-R1 tag protocol) -> `rewards` (EM, F1, format) -> `eval` (evaluation harness).
Importing the package loads nothing heavy.
"""

__version__ = "0.2.0"
