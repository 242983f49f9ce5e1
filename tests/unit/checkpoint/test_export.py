"""``dtppo export`` of a checkpoint written before checkpoints carried ``hf/`` and stored a tied embedding once:
rebuilt from the directories (here: the tiny shapes) its config names, the tied lm_head read from the embedding."""

import torch
from transformers import AutoModelForCausalLM

from dtppo.checkpoint import store as checkpoint
from dtppo.checkpoint.export import export_checkpoint
from dtppo.models.causal_lm import build_causal_lm, tiny_qwen2_config
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.models.value import ValueModel, build_backbone
from tests.support.recipes import tiny_config


def test_an_old_checkpoint_without_hf_and_with_both_tied_names_exports(tmp_path):
    cfg = tiny_config("ppo.init_from_sft=false")
    tok = build_char_tokenizer()
    policy = build_causal_lm(None, cfg.policy.model.tiny, len(tok), tok.pad_token_id, tok.eos_token_id, seed=5)
    tiny = tiny_qwen2_config(cfg.value.model.tiny, len(tok), tok.pad_token_id, tok.eos_token_id)
    critic = ValueModel(build_backbone(None, tiny, seed=6), seed=6)
    state = {"policy": {"model": policy.state_dict()}, "value": {"model": critic.state_dict()}}
    assert "lm_head.weight" in state["policy"]["model"]  # the old layout: every name, tied ones twice
    step_dir = checkpoint.save(tmp_path / "ckpt", 3, state, {}, cfg.to_dict(), keep_last=1)
    assert not (step_dir / checkpoint.HF_DIR).exists()
    export_checkpoint(tmp_path / "ckpt", tmp_path / "hf")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "policy")
    for name, tensor in policy.state_dict().items():
        assert torch.equal(exported.state_dict()[name], tensor), name
    reloaded = ValueModel.from_pretrained(tmp_path / "hf" / "critic")
    for name, tensor in critic.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
