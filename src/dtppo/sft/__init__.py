"""Supervised fine-tuning of the policy on worked solutions (``dtppo sft``)."""
