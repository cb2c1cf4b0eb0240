"""The agent protocols (`--protocol`): the model's side of its conversation with the search environment, in one
home (standard library only). The HTTP wire format of the retrieval service is another contract:
`verl_search.server.schemas`.

* `base.Protocol`: what a protocol fixes (prompt, stop strings, action parsing, observation frame,
  format rules, answer extraction); `registry.get_protocol(name)` resolves `--protocol`;
* `search_r1`, `tool`, `research`: the three search protocols; `baselines` (`direct`, `cot`, `rag`) and
  `ircot`: the baselines without a search policy;
* `vocabulary`: tags and their regexes, the environment's fixed messages, the trajectory field
  names, `DEFAULT_TOPK`, `parse_action` (the leaf every side shares);
* `answers`: the model's own `<answer>` in a tag-protocol response;
* `tokens`: token-exact cuts: a turn cut at its first stop string, an observation cut to its token
  budget (used by the agent loops, the generation engines and the quickstart);
* `trajectory.ResponseTokens`: a trajectory's response built turn by turn (every agent loop, the cold start).
"""
