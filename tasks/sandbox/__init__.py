"""A sandbox for model-generated Python: see `client.Sandbox`."""
