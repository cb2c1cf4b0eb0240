"""What a running command reads and how it ends, shared by every room (imports nothing else of ours, never verl).

* `options`: command-line flags generated from the option classes (each option declared once);
* `env`: the `VERL_SEARCH_*` environment variables, read in one place;
* `extras`: which optional part of the package a feature needs, and the `pip install` line that adds it;
* `exits`: exit codes and logging of the entry points (`verl-search`, `python -m verl_search.server`).
* `child`: one call in a fresh child process (`in_child`), for a long command that must not keep what it imports.
"""
