"""A tiny learned reward model for tests: a char-level Qwen2ForSequenceClassification trained in seconds on CPU.

The RM is trained through the same rendering, padding and last-token read as ``RewardModel.score``
(``encode_conversations`` + ``last_token_scores``), so what it learned is what scoring sees.

Its data imitates what a tiny char-level policy emits after a tiny-math prompt: printable ASCII (or digits and
arithmetic symbols, as an SFT policy writes) of length 1-48, with the preferred character at densities from
none (a random policy hits "7" about once in 95 characters) to all.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import Qwen2ForSequenceClassification

from dtppo.config import TinyMathConfig, TinyModelConfig
from dtppo.data.tiny_math import make_problem
from dtppo.models.causal_lm import tiny_qwen2_config
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.rewards.model import encode_conversations, last_token_scores

PRINTABLE = [chr(c) for c in range(32, 127)]
MATH_CHARS = list("0123456789 +-=#\n")
MAX_COMPLETION = 48
# Small enough to train in seconds on two cores, wide enough to learn a character share to r > 0.95.
RM_SHAPE = TinyModelConfig(
    hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64, max_position_embeddings=512
)


def digit_seven_share(completion: str) -> float:
    """The share of the completion's characters that are "7" (0 for an empty one): in [0, 1]."""
    return completion.count("7") / len(completion) if completion else 0.0


def sample_conversation(rng: random.Random) -> list[dict]:
    """A tiny-math question and a completion with a random density of "7"s."""
    question = make_problem(rng, TinyMathConfig()).question
    density = rng.choice([0.0, 0.02, rng.random() ** 2, rng.random(), 1.0 if rng.random() < 0.1 else rng.random()])
    pool = PRINTABLE if rng.random() < 0.5 else MATH_CHARS
    length = rng.randint(1, MAX_COMPLETION)
    completion = "".join("7" if rng.random() < density else rng.choice(pool) for _ in range(length))
    return [{"role": "user", "content": question}, {"role": "assistant", "content": completion}]


def held_out_conversations(n: int, seed: int = 1_000_003) -> list[list[dict]]:
    """``n`` conversations from a seed no training run of this module uses (training draws from ``seed``)."""
    rng = random.Random(seed)
    return [sample_conversation(rng) for _ in range(n)]


def train_tiny_reward_model(
    out_dir: str | Path,
    target: Callable[[str], float] = digit_seven_share,
    steps: int = 300,
    seed: int = 0,
    batch_size: int = 16,
    lr: float = 1e-2,
) -> Path:
    """Train a tiny RM to predict ``target(completion)`` (MSE, Adam) and save it, safetensors + tokenizer.

    Deterministic in ``seed`` (model init and data); returns ``out_dir``, a directory ``RewardModel`` loads.
    """
    tokenizer = build_char_tokenizer()
    config = tiny_qwen2_config(RM_SHAPE, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
    config.num_labels = 1
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForSequenceClassification(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    rng = random.Random(seed)
    threads = torch.get_num_threads()
    # Ops this small gain nothing from a second thread, and on shared cores its synchronisation costs 3-5x.
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            batch = [sample_conversation(rng) for _ in range(batch_size)]
            ids, mask, last = encode_conversations(
                tokenizer, batch, config.max_position_embeddings, tokenizer.pad_token_id
            )
            labels = torch.tensor([target(conv[-1]["content"]) for conv in batch])
            loss = torch.nn.functional.mse_loss(last_token_scores(model, ids, mask, last), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    out = Path(out_dir)
    model.eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
