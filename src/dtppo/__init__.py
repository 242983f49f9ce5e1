"""dtppo: PyTorch-native PPO post-training of language models with a correctly aligned critic."""

__version__ = "0.1.0"
