"""What a run writes and reads back: step checkpoints, the HF export, a critic's warm start."""
