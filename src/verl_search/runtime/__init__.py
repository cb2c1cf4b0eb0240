"""The runtime of a verl-search process: what it reads (flags, environment variables, installed extras), how it ends (exit
codes, entry-point logging) and the child processes it runs. Shared by every room; imports nothing else of ours,
never verl.

* `options`: command-line flags generated from the option classes (each option declared once);
* `env`: the `VERL_SEARCH_*` environment variables, read in one place;
* `extras`: which optional part of the package a feature needs, and the `pip install` line that adds it;
* `exits`: exit codes and logging of the entry points (`verl-search`, `python -m verl_search.server`).
* `child`: one call in a fresh child process (`in_child`), for a long command that must not keep what it imports.
"""
