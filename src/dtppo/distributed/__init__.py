"""Parallel layout (named mesh axes), collectives, parallelize() (TP+SP then FSDP2), rank launching."""
