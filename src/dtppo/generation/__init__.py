"""Generation: everything that produces tokens, behind the ``Generator`` protocol (the torch sampler with its
static-KV and graph decoders, vLLM, the generation ranks' client, the episode loop)."""
