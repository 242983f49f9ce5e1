"""The learned reward model (dtppo.rewards.model) and the critic started from it (dtppo.models.value)."""

import json
import shutil
import time

import pytest
import torch
from transformers import Qwen2ForCausalLM

from dtppo.config import RewardModelConfig
from dtppo.errors import InputError
from dtppo.models.causal_lm import tiny_qwen2_config
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.models.value import ValueModel, build_backbone, reward_model_head
from dtppo.rewards.model import RewardModel, encode_conversations
from tests.support.reward_model_fixture import (
    RM_SHAPE,
    digit_seven_share,
    held_out_conversations,
    train_tiny_reward_model,
)

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    start = time.perf_counter()
    path = train_tiny_reward_model(tmp_path_factory.mktemp("rm"))
    print(f"tiny RM trained in {time.perf_counter() - start:.1f}s")
    return path


def _rm(path, **kw):
    return RewardModel(RewardModelConfig(path=str(path), **kw), CPU)


def _copy(rm_dir, tmp_path, skip=()):
    out = tmp_path / "copy"
    shutil.copytree(rm_dir, out, ignore=lambda _, names: [n for n in names if n in skip])
    return out


def _ranks(x):
    """Average ranks, ties sharing one (many targets are exactly 0). [N] -> [N]."""
    less = (x[None, :] < x[:, None]).sum(1)
    equal = (x[None, :] == x[:, None]).sum(1)
    return less + (equal + 1) / 2


def _correlation(a, b):
    return torch.corrcoef(torch.stack([a.double(), b.double()]))[0, 1].item()


def test_rm_ranks_held_out_completions_by_the_property(rm_dir):
    convs = held_out_conversations(300)
    scores = _rm(rm_dir, batch_size=32).score(convs)
    target = torch.tensor([digit_seven_share(c[-1]["content"]) for c in convs])
    pearson, spearman = _correlation(scores, target), _correlation(_ranks(scores), _ranks(target))
    print(f"held-out pearson {pearson:.3f} spearman {spearman:.3f}")
    assert scores.shape == (300,) and scores.dtype == torch.float32
    assert pearson > 0.95 and spearman > 0.9


def test_rm_is_frozen_and_in_eval_mode(rm_dir):
    rm = _rm(rm_dir)
    assert not rm.model.training
    assert not any(p.requires_grad for p in rm.model.parameters())


def test_score_is_invariant_to_batch_size_padding_and_pad_id(rm_dir):
    convs = held_out_conversations(23, seed=7)
    one = _rm(rm_dir, batch_size=1).score(convs)
    rm = _rm(rm_dir, batch_size=7)
    assert torch.allclose(rm.score(convs), one, atol=1e-5, rtol=0)
    # A pad id that is also a real token (as with pad = eos) cannot move the read position.
    rm.pad_id = rm.tokenizer.convert_tokens_to_ids("7")
    assert torch.allclose(rm.score(convs), one, atol=1e-5, rtol=0)


def test_a_long_conversation_keeps_its_last_max_length_tokens(rm_dir):
    conv = held_out_conversations(1, seed=3)[0]
    completion = conv[-1]["content"]
    text = conv[0]["content"] + completion  # the char template renders user + assistant contents back to back
    keep = len(completion) + 10
    assert len(text) > keep
    tail = [{"role": "user", "content": text[-keep : -len(completion)]}, {"role": "assistant", "content": completion}]
    truncated = _rm(rm_dir, max_length=keep).score([conv])
    assert torch.allclose(truncated, _rm(rm_dir).score([tail]), atol=1e-5, rtol=0)
    assert not torch.allclose(truncated, _rm(rm_dir).score([conv]), atol=1e-5, rtol=0)


def test_a_pickle_only_directory_is_refused_and_never_unpickled(rm_dir, tmp_path, monkeypatch):
    rm = _rm(rm_dir)
    path = _copy(rm_dir, tmp_path, skip={"model.safetensors"})
    torch.save(rm.model.state_dict(), path / "pytorch_model.bin")

    def no_unpickling(*args, **kwargs):
        raise AssertionError("torch.load called on a reward model directory")

    monkeypatch.setattr(torch, "load", no_unpickling)
    with pytest.raises(InputError, match=r"reward\.model\.path.*pytorch_model\.bin") as err:
        _rm(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_missing_directory_is_refused(tmp_path):
    with pytest.raises(InputError, match=r"reward\.model\.path: .*nowhere"):
        _rm(tmp_path / "nowhere")


def test_two_labels_are_refused(rm_dir, tmp_path):
    path = _copy(rm_dir, tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["id2label"] = {"0": "bad", "1": "good"}
    config["label2id"] = {"bad": 0, "good": 1}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=r"reward\.model\.path: .*num_labels=2"):
        _rm(path)


def test_a_tokenizer_without_chat_template_is_refused(rm_dir, tmp_path):
    path = _copy(rm_dir, tmp_path, skip={"chat_template.jinja", "tokenizer.json", "tokenizer_config.json"})
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = None
    tokenizer.save_pretrained(path)
    with pytest.raises(InputError, match=r"reward\.model\.path: .*chat template"):
        _rm(path)


def test_no_padding_token_anywhere_is_refused(rm_dir, tmp_path):
    path = _copy(rm_dir, tmp_path, skip={"chat_template.jinja", "tokenizer.json", "tokenizer_config.json"})
    config = json.loads((path / "config.json").read_text())
    config["pad_token_id"] = None
    (path / "config.json").write_text(json.dumps(config))
    tokenizer = build_char_tokenizer()
    tokenizer.pad_token, tokenizer.eos_token = None, None
    tokenizer.save_pretrained(path)
    with pytest.raises(InputError, match=r"reward\.model\.path: .*padding token"):
        _rm(path)


def test_a_critic_from_the_rm_starts_at_the_rm_score(rm_dir):
    rm = _rm(rm_dir)
    conv = held_out_conversations(1, seed=11)[0]
    ids, mask, last = encode_conversations(rm.tokenizer, [conv], 1024, rm.pad_id)
    head = reward_model_head(str(rm_dir))
    assert head[0].shape == (1, RM_SHAPE.hidden_size) and head[1] is None  # Qwen2's score head has no bias
    backbone = build_backbone(str(rm_dir)).eval()
    unshifted = ValueModel(backbone, head=head, shift=False).eval()
    with torch.no_grad():
        at_last = unshifted(ids, mask)[0, last[0]]
    assert torch.allclose(at_last, rm.score([conv])[0], atol=1e-5, rtol=0)
    # Shifted, V(s_t) is head(h[t-1]): at the EOS that follows the completion it is the RM's score.
    shifted = ValueModel(backbone, head=head, shift=True).eval()
    with_eos = torch.cat([ids, torch.tensor([[rm.tokenizer.eos_token_id]])], dim=1)
    with torch.no_grad():
        values = shifted.values(with_eos, torch.ones_like(with_eos))
    assert torch.allclose(values[0, -1], rm.score([conv])[0], atol=1e-5, rtol=0)
    assert torch.equal(shifted.score.bias, torch.zeros(1))


def test_reward_model_head_reads_safetensors_only(rm_dir, tmp_path, monkeypatch):
    path = _copy(rm_dir, tmp_path, skip={"model.safetensors"})
    torch.save(_rm(rm_dir).model.state_dict(), path / "pytorch_model.bin")
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load called on a reward model directory"))
    with pytest.raises(InputError, match="score.weight"):
        reward_model_head(str(path))


def test_reward_model_head_is_none_for_other_directories(tmp_path):
    tokenizer = build_char_tokenizer()
    config = tiny_qwen2_config(RM_SHAPE, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "lm")
    assert reward_model_head(str(tmp_path / "lm")) is None
    assert reward_model_head(None) is None
    assert reward_model_head("Qwen/not-a-local-directory") is None
