"""File- and project-level code problems: the YAML format and loader, the shipped problems, reading files out of a
response, the seeded family, their verifier (`verifier.py`) and the reference / wrong-solution check.

May import: storage, tasks.errors, tasks.sandbox, tasks.verifiers.
"""
