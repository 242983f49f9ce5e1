"""Running the user's code (reward functions, environments): loading it by spec, the bounded process pool, the
sandbox limits. No torch: scoring and environment processes import it."""
