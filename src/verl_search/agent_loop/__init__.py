"""Agent loops for verl: the Search-R1 tag protocol (`search_r1.SearchR1AgentLoop`) and ReSearch
(`research.ReSearchAgentLoop`).

The loop is registered with verl through `agent_loops.yaml` (see `verl_search.verl_config.shipped`), not on
import, so importing this package changes nothing in verl.
"""
