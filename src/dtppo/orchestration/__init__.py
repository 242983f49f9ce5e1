"""Rank launchers: where the ranks of a run start (local processes or Ray actors)."""
