"""What dtppo's tests and benchmarks share, as ``torch.testing`` is for torch: tiny configs (``configs``), made-up
batches (``batches``) and fresh workers run through one round in one process or on gloo ranks (``workers``).
Nothing in dtppo imports it."""
