"""Generation backends: the torch KV-cache sampler."""
