"""A task PPO with a critic learns in a few steps, for the learning gate (tests/functional/test_learning_gate.py).

The policy answers with two tokens from an 11-token vocabulary (8 characters besides pad, EOS and unknown); the
reward is 1 when the first is ``a`` (about 1 in 9 at the random start) and depends on nothing else. So:

- with V(s_t) aligned to the state before each token, the value of the first answer token can only be the
  expected reward, its advantage is ``R - E[R]`` and the policy learns to say ``a``; the critic predicts the
  return from the second token on (it has seen the first), so its explained variance approaches 1/2;
- a critic that sees the token it judges (the value shift off) predicts ``R`` at the first token already: the
  advantage of the choice is the critic's error and, unwhitened, the policy barely moves. Such a critic is
  learnt within a step or two over 8 answer tokens, which makes this control fail reliably (over the ~96 of
  the character tokenizer the critic needs more steps than the policy does and both arms learn).

Advantages are not whitened here: whitening rescales the unshifted critic's small residual, which still leans
towards ``R`` while the critic underfits, to unit size, and measures the race between the two learners instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from tests.support.recipes import REPO

CHARS = "abcdef?\n"
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}{{ '\\n' }}{% endif %}"
PROMPTS = ["?", "a?", "b?", "c?", "d?", "e?", "f?", "??"]


def write_choice_task(root: Path) -> dict[str, Path]:
    """The task's model directory (random weights, seed 0) and training rows under ``root``."""
    model = root / "model"
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2} | {c: i + 3 for i, c in enumerate(CHARS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.chat_template = TEMPLATE
    tok.save_pretrained(model)
    shape = Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        Qwen2ForCausalLM(shape).save_pretrained(model)
    rows = root / "prompts.jsonl"
    rows.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS * 8))
    return {"model": model, "rows": rows}


def choice_args(files: dict[str, Path], log_dir: str, *extra: str) -> list[str]:
    """``dtppo ppo`` on the task: base.yaml's defaults, 64 samples per step in minibatches of 16, the reward function
    in this process (no scoring pool), validation on 8 prompts at the last step only, no checkpoints; ``extra``
    after these (the later override wins)."""
    return [
        "ppo",
        str(REPO / "recipes" / "base.yaml"),
        "data.task=custom",
        f"data.train.path={files['rows']}",
        f"data.validation.path={files['rows']}",
        f"reward.functions=[{Path(__file__).with_name('choice_reward.py')}:first_is_a]",
        "reward.num_workers=0",
        f"policy.model.path={files['model']}",
        "policy.generation.max_new_tokens=2",
        "ppo.num_prompts_per_step=64",
        "ppo.validation.at_start=false",
        "ppo.validation.max_samples=8",
        "ppo.validation.batch_size=8",
        "policy.optimizer.lr=3e-3",
        "value.optimizer.lr=3e-3",
        *[f"{w}.train_{k}_batch_size=16" for w in ("policy", "value") for k in ("global", "micro")],
        "checkpointing.enabled=false",
        "logger.tensorboard=false",
        "logger.progress=false",
        f"logger.log_dir={log_dir}",
        *extra,
    ]
