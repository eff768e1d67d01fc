"""A sandbox for model-generated Python: the client (`client.Sandbox`) and the warm server it starts
(`zygote.py`), which forks each run into the jail (`jail.py`) and watches it (`watch.py`) under its budgets
(`budget.py`, `limits.py`); file-level suites run the tests in a process apart from the candidate's objects
(`suite.py`, `remote.py` for the candidate's side, `proxies.py` for the tests'); the server's process chores are
`processes.py`'s.

May import: tasks.errors only (the `sandbox-alone` and `independent-stages` contracts): it runs
model-generated code and depends on nothing of the stages."""
