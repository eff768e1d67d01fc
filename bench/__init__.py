"""Benchmarks behind `rlvr bench`, the top floor: each measures against a baseline run on the same machine in the
same process, and reports as a table or one JSON object. `cli.py` is their command group.

May import: every floor below (`flows`, `trainers`, `tasks`, `policy`, `storage`); no benchmark imports another (shared
set-up lives in its own module, e.g. `warm.py`)."""
