"""The protocol between the model and its environment, in one home (standard library only).

* `vocabulary`: tags and their regexes, the environment's fixed messages, the trajectory field
  names, `DEFAULT_TOPK`, `parse_action` (the leaf every side shares; rewards import it alone);
* `tokens`: the tag protocol token-exact: a turn cut at its first stop string, an observation cut
  to its token budget (used by the agent loop, the generation engines and the quickstart).
"""
