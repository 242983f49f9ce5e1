"""Model builders: causal LM policy, character tokenizer, value model (backbone + scalar head)."""
