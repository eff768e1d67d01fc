"""A sandbox for model-generated Python: see `client.Sandbox`.

May import: tasks.errors only (the `sandbox-alone` and `independent-stages` contracts): it runs
model-generated code and depends on nothing of the stages."""
