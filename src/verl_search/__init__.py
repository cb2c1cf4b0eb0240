"""verl-search: train and evaluate search agents (Search-R1) on verl.

Subpackages follow the data flow: `datasets` / `data` (shipped data, preprocessing, downloads) and
`retrieval` (corpus, BM25/dense retrievers, index builder) -> `server` / `web` (the `/retrieve` HTTP
service) -> `tools` (verl `SearchTool`) and `agent_loop` (Search-R1 tag protocol), generating through
`generation` (LLM engines) -> `rewards` (EM, F1, format) -> `eval` (evaluation harness) and
`training` (verl's trainer, CPU plugin); `quickstart` runs the whole path in one command.
Every room shares `protocol` (tags, messages, trajectory fields) and `runtime` (flags, environment
variables, extras, exit codes); the verl side shares `verl_config` (verl's config composed and
checked, the shipped YAMLs, the verl version guard). Importing the package loads nothing heavy.
"""

__version__ = "0.2.0"
