"""File- and project-level code problems: the YAML format and loader, the shipped problems, reading files out of a
response, the seeded family, and the reference / wrong-solution check.

May import: tasks.generators, tasks.verifiers.
"""
