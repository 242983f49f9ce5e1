"""PPO's workers train with dropout off: π_old (recomputed without grad) and π in training mode are the same
distribution before any update, so the ratio starts at 1. GPT-2's directory has dropout 0.1 in three places."""

import torch

from dtppo.models.causal_lm import build_causal_lm
from dtppo.models.tokenizer import load_tokenizer
from dtppo.types import Experience
from dtppo.workers.policy import PolicyWorker
from tests.support.batches import synthetic_experience
from tests.support.recipes import tiny_config


def _rows(vocab: int) -> Experience:
    return synthetic_experience(
        vocab,
        batch=4,
        prompt_lengths=[5, 3, 7, 4],
        response_lengths=[6, 9, 2, 5],
        short_first_half=None,
        first_id=0,
        rewards=False,
        targets=False,
    )


def test_the_policy_trains_without_dropout(gpt2_dir):
    cfg = tiny_config("ppo.init_from_sft=false", f"policy.model.path={gpt2_dir}")
    tokenizer = load_tokenizer(str(gpt2_dir))
    rows = _rows(len(tokenizer))
    worker = PolicyWorker(cfg, tokenizer)
    old = worker.get_logprobs(rows)
    worker.prepare_for_training()
    assert worker.model.training
    with torch.no_grad():
        now = worker._token_logprobs(worker.model, rows)
    assert torch.equal(now, old)
    # negative control: the same directory as transformers loads it, in training mode, draws dropout masks
    raw = build_causal_lm(str(gpt2_dir), cfg.policy.model.tiny, len(tokenizer), 0, 0, 0).train()
    with torch.no_grad():
        a, b = (raw(input_ids=rows.input_ids, attention_mask=rows.attention_mask).logits for _ in range(2))
    assert not torch.equal(a, b)
