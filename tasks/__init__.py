"""The stages as plain functions over frames and the lake, and the domain logic under them: curation, generators,
verifiers and the sandbox, rollout, advantages and dynamic sampling, self-play, the curriculum, evaluation and the
report's data. Shared below every stage package: the errors stages raise to each other (`errors.py`), a tripwire's
checks as sentences (`tripwires.py`).

May import: `policy` and `storage` only (the `floors` contract); never Prefect, Typer, `trainers`, `flows` or
`bench`. Each subpackage's docstring names the packages it uses; the ones that stand alone are held to it by
import-linter."""
