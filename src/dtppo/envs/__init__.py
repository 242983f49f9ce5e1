"""Environments of multi-turn episodes (docs/guides/episodes.md): the interface a user's class implements, the processes
that run it, and the client the episode loop (``rollout.episodes``) calls."""
