"""Reward functions that score sampled responses against reference answers."""
