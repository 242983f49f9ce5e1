"""Worker groups: where the ranks of a run are started (local processes or Ray actors)."""
