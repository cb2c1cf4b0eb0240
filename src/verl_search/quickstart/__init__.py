"""`verl-search quickstart` and `verl-search study`: train a small model to search and show what it learned, on
the CPU.

One command, stages skipped when their output is complete (`pipeline`): the BM25 index of the mini
corpus; the untrained model evaluated on the test split; a cold start (`cold_start`: supervised
search-then-answer trajectories through verl's SFT trainer); GRPO steps through verl's `main_ppo`
(`grpo`); the cold-start and GRPO models evaluated with the same protocol settings; one report
(`verl_search.report.quickstart`). Options: `options.QuickstartOptions`; a study's, `options.StudyOptions` (the
frontier and probe set, `frontier`; the permuted-reward control; `export`).
"""
