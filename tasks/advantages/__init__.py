"""Group-relative advantages, DAPO shaping and filtering, staleness: pure functions over Polars frames."""
