"""verl-search: train and evaluate search agents (Search-R1) on verl.

Subpackages follow the data flow: `datasets` (shipped data, preprocessing, downloads) and
`retrieval` (corpus, BM25/dense retrievers, index builder) -> `server` (the `/retrieve` HTTP
service, index or web backend) -> `tools` (verl `SearchTool`) and `agent_loop` (the tag protocols),
generating through `llm` (LLM engines, model loading) -> `rewards` (EM, F1, format) -> `eval`
(evaluation harness) and `training` (verl's trainer) on `cpu` (the CPU backend); `quickstart` runs
the whole path in one command.
Every room shares `protocol` (tags, messages, trajectory fields) and `process` (flags, environment
variables, extras, exit codes); the verl side shares `verl_config` (verl's config composed and
checked, the shipped YAMLs, the verl version guard). Importing the package loads nothing heavy.
"""

__version__ = "0.2.0"
